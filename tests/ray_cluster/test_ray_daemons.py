"""envd.integrations.ray: daemons placed one per Ray node, stepped over all of
them, faults (too few nodes, a killed daemon, a killed actor), clean shutdown."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from support.ray_cluster import local_cluster, ray  # first: it sets Ray's environment

import envd
from envd.integrations.ray import start_daemons

#: Simulated Ray nodes (the head included), one CPU each.
NUM_NODES = 3

#: Each test daemon's share of its node's one CPU: the module's set and a
#: test's own set fit side by side.
BUNDLE = {"CPU": 0.25}

#: Generous: the machine running the tests may be loaded.
DEADLINE_S = 120.0


def _alive(pid: int) -> bool:
    """Whether pid runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_until(predicate, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {DEADLINE_S:.0f} s: {what}")
        time.sleep(0.1)


def _segments_of(pid: int) -> list[str]:
    return [name for name in os.listdir("/dev/shm") if name.startswith(f"envd-{pid}-")]


def _assert_gone(daemons) -> None:
    """No daemon process, socket file or segment of daemons is left."""
    for d in daemons.daemons:
        _wait_until(lambda: not _alive(d.pid), f"daemon {d.pid} exits")
        _wait_until(lambda: not os.path.exists(os.path.dirname(d.ipc[len("ipc://"):])),
                    f"{d.ipc}'s folder is removed")
        assert _segments_of(d.pid) == []


#: DaemonSets left to ray.shutdown(): nothing of theirs may outlive it.
_LEFT_TO_SHUTDOWN: list = []


@pytest.fixture(scope="module")
def ray_cluster():
    with local_cluster(NUM_NODES) as cluster:
        yield cluster
    for placed in _LEFT_TO_SHUTDOWN:  # ray.shutdown() without DaemonSet.close()
        _assert_gone(placed)


@pytest.fixture(scope="module")
def daemons(ray_cluster):
    """The module's daemons, never closed: ray.shutdown() must end them."""
    placed = start_daemons(NUM_NODES, threads=1, bundle=BUNDLE)
    _LEFT_TO_SHUTDOWN.append(placed)
    return placed


def test_one_daemon_per_node_on_loopback(daemons):
    nodes = {node["NodeID"] for node in ray.nodes() if node["Alive"]}
    assert {d.node_id for d in daemons.daemons} == nodes
    assert len(nodes) == NUM_NODES
    for d in daemons.daemons:
        assert d.tcp.startswith("tcp://127.0.0.1:")
        assert _alive(d.pid)
    here = ray.get_runtime_context().get_node_id()
    endpoints = daemons.endpoints()
    assert [e.startswith("ipc://") for e in endpoints] == \
        [d.node_id == here for d in daemons.daemons]
    assert sum(e.startswith("ipc://") for e in endpoints) == 1  # the driver's node


def test_stepping_over_all_daemons_is_bit_identical_to_in_process(daemons):
    num_envs, seed = 7, 1234
    reference = envd.make("CartPole-v1", num_envs=num_envs, seed=seed)
    rng = np.random.default_rng(0)
    with daemons.connect(timeout=60) as client:
        env = client.make("CartPole-v1", num_envs=num_envs, seed=seed)
        assert len(env.shards) == NUM_NODES
        before = sum(s["env_steps"] for s in client.status())
        obs, _ = env.reset()
        ref_obs, _ = reference.reset()
        np.testing.assert_array_equal(obs, ref_obs)
        for _ in range(200):
            actions = rng.integers(0, 2, num_envs)
            got, want = env.step(actions), reference.step(actions)
            for a, b in zip(got[:4], want[:4]):
                np.testing.assert_array_equal(a, b)
        stepped = [s["env_steps"] for s in client.status()]
        assert sum(stepped) - before == 200 * num_envs
    reference.close()


def test_async_across_daemons_exactly_once(daemons):
    num_envs, batch = 6, 2
    with daemons.connect(timeout=60) as client:
        env = client.make("CartPole-v1", num_envs=num_envs, seed=5, batch_size=batch)
        before = sum(s["env_steps"] for s in client.status())
        env.async_reset()
        in_flight = set(range(num_envs))
        sends = np.zeros(num_envs, np.int64)
        recvs = np.zeros(num_envs, np.int64)
        for _ in range(150):
            *_, info = env.recv()
            ids = info["env_id"].tolist()
            assert len(ids) == batch and len(set(ids)) == batch
            assert set(ids) <= in_flight, (ids, in_flight)  # each env returned once per send
            in_flight -= set(ids)
            recvs[ids] += 1
            env.send(np.zeros(batch, np.int64), np.asarray(ids))
            in_flight |= set(ids)
            sends[ids] += 1
        while in_flight:
            *_, info = env.recv()
            ids = info["env_id"].tolist()
            assert set(ids) <= in_flight
            in_flight -= set(ids)
            recvs[ids] += 1
        np.testing.assert_array_equal(recvs, sends + 1)  # + the async reset's
        assert sum(s["env_steps"] for s in client.status()) - before == sends.sum()


def test_fewer_nodes_than_asked_is_refused_and_leaves_nothing(ray_cluster):
    from ray.util import placement_group_table
    before = set(map(int, filter(str.isdigit, os.listdir("/proc"))))
    with pytest.raises(envd.DaemonError, match=rf"asked for {NUM_NODES + 1} daemons.*"
                       rf"{NUM_NODES} live node"):
        start_daemons(NUM_NODES + 1, threads=1, bundle=BUNDLE, timeout=5)
    states = {g["state"] for g in placement_group_table().values()
              if g["strategy"] == "STRICT_SPREAD" and len(g["bundles"]) == NUM_NODES + 1}
    assert states <= {"REMOVED"}
    after = set(map(int, filter(str.isdigit, os.listdir("/proc"))))
    started = [pid for pid in after - before if _alive(pid)
               and b"envd" in Path(f"/proc/{pid}/cmdline").read_bytes()
               and b"--curve-secret-key" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert started == []


def test_a_daemon_that_cannot_start_is_reported_and_leaves_nothing(ray_cluster):
    from ray.util import placement_group_table
    before = set(placement_group_table())
    with pytest.raises(envd.DaemonError, match=r"did not start: exit status 2.*no-such-flag"):
        start_daemons(1, threads=1, bundle=BUNDLE, daemon_args=["--no-such-flag"])
    states = [g["state"] for pg_id, g in placement_group_table().items() if pg_id not in before]
    assert states and set(states) == {"REMOVED"}


def test_a_killed_daemon_is_reported_naming_its_node(ray_cluster):
    with start_daemons(2, threads=1, bundle=BUNDLE) as placed:
        with placed.connect(timeout=60) as client:
            env = client.make("CartPole-v1", num_envs=4, seed=0)
            env.reset()
            env.step(np.zeros(4, np.int64))
            victim = placed.daemons[1]
            os.kill(victim.pid, signal.SIGKILL)
            with pytest.raises(envd.DaemonError) as raised:
                with placed.naming_nodes():
                    for _ in range(100):  # the loss may show one step late
                        env.step(np.zeros(4, np.int64))
            message = str(raised.value)
            assert victim.node_id[:12] in message and "SIGKILL" in message
            assert isinstance(raised.value.__cause__, envd.EnvdError)
            with pytest.raises(envd.DaemonError, match=victim.node_id[:12]):
                placed.check()
            assert [info for info, _ in placed.dead()] == [victim]
    _assert_gone(placed)


def test_a_killed_actor_takes_its_daemon_along(ray_cluster):
    placed = start_daemons(1, threads=1, bundle=BUNDLE)
    try:
        pid = placed.daemons[0].pid
        assert _alive(pid)
        ray.kill(placed.actors[0])
        _wait_until(lambda: not _alive(pid), "the daemon dies with its actor")
        _wait_until(lambda: not os.path.exists(placed.daemons[0].ipc[len("ipc://"):]),
                    "the socket file is removed")
        assert _segments_of(pid) == []
        assert [info for info, _ in placed.dead()] == [placed.daemons[0]]
    finally:
        placed.close()


def test_without_ray_one_line_names_the_extra():
    code = ("import sys; sys.modules['ray'] = None\n"
            "try:\n    import envd.integrations.ray\n"
            "except ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=DEADLINE_S, check=True).stdout
    assert out.strip() == "envd.integrations.ray needs Ray: pip install 'envd-rl[ray]'"
