"""The per-session thread cap, ``client.make(..., max_threads=K)``: results
bit-identical to the in-process env for every cap (sync and async, over the
socket and the fast path), the cap shown by status and ``envd status``, the
hello advertising it, and every out-of-bounds cap refused with a clear error
that leaves the daemon and its other sessions as they were."""
from __future__ import annotations

import numpy as np
import pytest
from support.async_steps import async_trajectories, per_env_actions, sync_trajectories
from support.builtin_envs import random_actions
from support.daemon import DaemonProcess, segments_of, wait_until

import envd
from envd.errors import InvalidArgumentError
from envd.tools.cli import status_table

#: None: no cap; 0: inline on the serving thread; 1 and 2 of the daemon's 2 threads.
CAPS = [0, 1, 2, None]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A daemon with a pool of 2 threads and a client; at the end no session
    is left, the daemon drains to exit status 0 and leaves no segment."""
    with DaemonProcess(tmp_path_factory.mktemp("max_threads") / "daemon", "--threads", "2",
                       "--lease-timeout", "10") as daemon, daemon.connect() as client:
        yield daemon, client
        wait_until(lambda: client.status()["sessions"] == 0, what="every session closed")
    assert daemon.proc.returncode == 0, daemon.log()
    assert segments_of(daemon.pid) == []


def trajectory(env, steps: int, seed: int) -> list[bytes]:
    """Reset, then `steps` steps with random actions of a fixed generator."""
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    out = [obs.tobytes()]
    for _ in range(steps):
        obs, rew, term, trunc, _ = env.step(random_actions(env.single_action_space,
                                                           env.num_envs, rng))
        out += [obs.tobytes(), rew.tobytes(), term.tobytes(), trunc.tobytes()]
    return out


# Sizes whose uncapped steps go to the pool (their cost is above a wake-up),
# so that the caps change the dispatch.
@pytest.mark.parametrize("env_id,num_envs", [("CartPole-v1", 4096), ("Acrobot-v1", 512),
                                             ("ConnectFour-v0", 512)])
@pytest.mark.parametrize("fast_path", [False, True], ids=["socket", "fast"])
def test_sync_results_are_identical_for_every_cap(served, env_id, num_envs, fast_path):
    _, client = served
    with envd.make(env_id, num_envs, num_threads=0) as local:
        reference = trajectory(local, 25, seed=9)
    for cap in CAPS:
        with client.make(env_id, num_envs, max_threads=cap, fast_path=fast_path) as env:
            assert env.max_threads == cap  # as the make reply echoes it
            if fast_path:
                assert env.fast_path
            assert trajectory(env, 25, seed=9) == reference, f"{env_id} max_threads={cap}"


@pytest.mark.parametrize("env_id", ["Acrobot-v1", "ConnectFour-v0"])
@pytest.mark.parametrize("fast_path", [False, True], ids=["socket", "fast"])
def test_async_results_equal_sync_mode_for_every_cap(served, env_id, fast_path):
    """send/recv under a cap: each env's trajectory is its sync trajectory in-process."""
    _, client = served
    num_envs, steps = 64, 20
    actions = per_env_actions(envd.native.get_spec(env_id).action_space, num_envs, steps, seed=4)
    reference = sync_trajectories(env_id, num_envs, steps, actions)
    for cap in CAPS:
        runs, received = async_trajectories(
            lambda **kw: client.make(env_id, num_envs, seed=11, max_threads=cap,
                                     fast_path=fast_path, **kw),
            num_envs, steps, actions, 16, np.random.default_rng(cap or 7))
        for i in range(num_envs):
            assert runs[i] == reference[i][:len(runs[i])], (env_id, cap, i)
        assert received.sum() > num_envs * steps // 2


def test_status_and_envd_status_show_the_cap(served):
    _, client = served
    assert client.capabilities.max_threads  # the hello advertises it
    with client.make("CartPole-v1", 8, max_threads=0) as a, \
            client.make("CartPole-v1", 8) as b, client.make("Acrobot-v1", 8, max_threads=2) as c:
        rows = {row["session"]: row for row in client.status()["session_table"]}
        assert {rows[e.session[:8]]["max_threads"] for e in (a, b, c)} == {0, None, 2}
        table = status_table(client.status()).splitlines()
        header = next(line for line in table if line.startswith("SESSION"))
        assert "THREADS" in header.split()
        column = header.split().index("THREADS") - 1  # "ENV ID" is two words in the header
        shown = {line.split()[0]: line.split()[column] for line in table
                 if line.split() and line.split()[0] in rows}
        assert shown == {a.session[:8]: "0", b.session[:8]: "all", c.session[:8]: "2"}


@pytest.mark.parametrize("bad,message", [
    (3, r"max_threads=3 is out of range: this daemon's pool has 2 threads \(--threads\)"),
    (1000, r"max_threads=1000 is out of range: this daemon's pool has 2 threads"),
    (-1, r"max_threads=-1 is out of range"),
    ("1", r"max_threads must be an int"),
    (1.0, r"max_threads must be an int"),
    (True, r"max_threads must be an int"),
])
def test_a_cap_out_of_bounds_is_refused_and_harms_nothing(served, bad, message):
    """Through the client and as a raw request (past the client's checks):
    invalid_argument naming the bound; the daemon, and a session stepping
    meanwhile, carry on; nothing is left behind."""
    daemon, client = served
    with client.make("CartPole-v1", 16, seed=1, max_threads=1) as other:
        other.reset(seed=1)
        before = client.status()
        with pytest.raises(InvalidArgumentError, match=message):
            client.make("CartPole-v1", 4, max_threads=bad)
        raw = {"type": "make", "env_id": "CartPole-v1", "num_envs": 4, "max_threads": bad}
        with pytest.raises(InvalidArgumentError, match="max_threads"):
            client.channel.request(raw)
        after = client.status()
        assert after["sessions"] == before["sessions"] == 1
        assert after["shm_bytes"] == before["shm_bytes"]
        obs, *_ = other.step(np.zeros(16, np.int64))
        assert obs.shape == (16, 4)
    wait_until(lambda: segments_of(daemon.pid) == [], what="the session's segment freed")


def test_a_multiclient_passes_the_cap_to_every_daemon(served, tmp_path):
    """MultiClient.make(max_threads=K): each daemon checks K against its own
    --threads (the refusal names the daemon), and the capped shards together
    step exactly as one in-process env."""
    daemon, _ = served
    with DaemonProcess(tmp_path / "one", "--threads", "1") as small, \
            envd.connect([daemon.endpoint, small.endpoint], timeout=30) as multi:
        with pytest.raises(InvalidArgumentError, match=f"the daemon at {small.endpoint}: its "
                           r"pool has 1 threads \(--threads\)"):
            multi.make("Acrobot-v1", 64, max_threads=2)  # over the small daemon's 1 thread
        with daemon.connect() as probe:
            assert probe.status()["sessions"] == 0  # refused before any daemon made anything
        with multi.make("Acrobot-v1", 64, max_threads=1) as env, \
                envd.make("Acrobot-v1", 64, num_threads=0) as local:
            assert trajectory(env, 10, seed=4) == trajectory(local, 10, seed=4)
        with small.connect() as probe:
            assert probe.status()["sessions"] == 0
