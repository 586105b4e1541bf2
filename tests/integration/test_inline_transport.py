"""The inline transport: sessions whose arrays travel in the messages because
the client cannot map the daemon's shared memory.

Bit-identity with shared memory for every env and mode is covered by running
test_daemon_equivalence.py and test_daemon_async.py over both transports;
here: how the transport is chosen (auto falls back only where mapping really
fails: a daemon with its own /dev/shm, as on another host), what a forced
transport does, and what the daemon does with malformed inline requests."""
from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pytest
from support.builtin_envs import random_actions
from support.daemon import DEADLINE, DaemonProcess, segments_of, wait_until

import envd


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with DaemonProcess(tmp_path_factory.mktemp("inline") / "daemon", "--threads", "1") as proc:
        yield proc
    assert proc.proc.returncode == 0, proc.log()
    assert segments_of(proc.pid) == []


#: Runs a daemon in its own mount namespace with its own empty /dev/shm: this
#: host's processes cannot see its segments, as if it ran on another host
#: (only the ipc socket, in a shared folder, connects them).
PRIVATE_SHM = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
               'mount -t tmpfs -o size=64m,mode=1777 envd-test /dev/shm && exec "$0" "$@"']


def _can_unshare_mount() -> str | None:
    """Why a private /dev/shm cannot be made here, or None."""
    if shutil.which("unshare") is None:
        return "no unshare command"
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs envd-probe /dev/shm"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot make a mount namespace with its own /dev/shm: {probe.stderr.strip()}"
    return None


@pytest.fixture(scope="module")
def remote_daemon(tmp_path_factory):
    reason = _can_unshare_mount()
    if reason is not None:
        pytest.skip(f"{reason} (needs root or user namespaces)")
    with DaemonProcess(tmp_path_factory.mktemp("private-shm"), "--threads", "1",
                       prefix=PRIVATE_SHM) as daemon:
        yield daemon
    assert daemon.proc.returncode == 0, daemon.log()


def _steps_match_in_process(remote, env_id, num_envs, seed, steps=60):
    local = envd.make(env_id, num_envs, seed=seed, num_threads=0)
    rng = np.random.default_rng(seed)
    try:
        assert remote.reset(seed=seed)[0].tobytes() == local.reset(seed=seed)[0].tobytes()
        for _ in range(steps):
            actions = random_actions(local.single_action_space, num_envs, rng)
            for a, b in zip(remote.step(actions)[:4], local.step(actions)[:4]):
                assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
    finally:
        local.close()


# ---- choosing the transport -------------------------------------------------------------
def test_auto_takes_shared_memory_on_this_host(daemon):
    with daemon.connect() as client, client.make("CartPole-v1", 4, seed=0) as env:
        assert env.transport == "shm"
        assert "transport='shm'" in repr(env)


def test_envd_transport_variable_picks_the_default(daemon, monkeypatch):
    monkeypatch.setenv("ENVD_TRANSPORT", "inline")
    with daemon.connect() as client:
        with client.make("CartPole-v1", 4, seed=0) as env:
            assert env.transport == "inline"
        with client.make("CartPole-v1", 4, seed=0, transport="shm") as env:
            assert env.transport == "shm"  # the argument wins
        monkeypatch.setenv("ENVD_TRANSPORT", "carrier-pigeon")
        with pytest.raises(envd.InvalidArgumentError, match="transport must be one of auto, shm"):
            client.make("CartPole-v1", 4)


def test_unknown_transport_is_refused_before_any_session(daemon):
    with daemon.connect() as client:
        with pytest.raises(envd.InvalidArgumentError, match="got 'tcp'"):
            client.make("CartPole-v1", 4, transport="tcp")
        assert client.status()["sessions"] == 0


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Snake-v0", "ConnectFour-v0"])
def test_auto_falls_back_to_inline_where_the_segment_is_out_of_reach(remote_daemon, env_id):
    with envd.connect(remote_daemon.endpoint) as client:
        with client.make(env_id, 5, seed=4) as env:
            assert env.transport == "inline"
            _steps_match_in_process(env, env_id, 5, seed=4)


def test_forced_shm_out_of_reach_says_why_and_leaves_no_session(remote_daemon):
    with envd.connect(remote_daemon.endpoint) as client:
        with pytest.raises(envd.SharedMemoryError, match="no such segment here.*transport='auto'"):
            client.make("CartPole-v1", 4, transport="shm")
        wait_until(lambda: client.status()["sessions"] == 0, what="the session to be closed")


# ---- malformed inline requests -----------------------------------------------------------
def _raw(client, header, blobs=()):
    return client.channel.request(header, [memoryview(np.ascontiguousarray(b)).cast("B")
                                    if isinstance(b, np.ndarray) else b for b in blobs])


def test_malformed_inline_requests_are_refused_and_the_session_survives(daemon):
    with daemon.connect() as client, \
            client.make("CartPole-v1", 4, seed=0, transport="inline") as env:
        env.reset()
        session = env.session
        actions = {"dtype": "<i8", "shape": [4]}
        cases = [
            ({"type": "reset", "session": session, "seeds": True, "inline": True}, [],
             "1 data frame"),
            ({"type": "reset", "session": session, "seeds": True, "inline": True},
             [np.zeros(3, np.uint64)], "reset_seeds must be 32 bytes"),
            ({"type": "reset", "session": session, "mask": True}, [np.ones(4, bool)],
             "only taken with inline"),
            ({"type": "step", "session": session, "inline": True}, [],
             "actions must come as a data frame"),
            ({"type": "step", "session": session, "inline": True, "actions": actions},
             [np.zeros(3, np.int64)], "must hold 32 bytes"),
        ]
        for header, blobs, message in cases:
            with pytest.raises(envd.EnvdError, match=message):
                _raw(client, header, blobs)
        # nothing of it reached the envs: they go on like an untouched twin
        _steps_match_in_process(env, "CartPole-v1", 4, seed=0, steps=20)


def test_an_inline_send_never_writes_the_rows_of_envs_in_flight(daemon):
    """A send naming an env still on the pool is refused, and its actions row,
    which a worker may be reading, is left alone: the env's result is that of
    the actions it was sent with.  (256 ConnectFour envs searching 8 plies
    deep take about 0.1 s on one thread: the second send, a round trip after
    the first, comes while they are in flight.)"""
    n = 256
    with daemon.connect() as client, \
            client.make("ConnectFour-v0", n, seed=2, batch_size=n, depth=8,
                        transport="inline") as env:
        env.async_reset()
        env.recv()
        first = np.arange(n) % 7
        send = {"type": "send", "session": env.session, "inline": True}
        ids = np.arange(n, dtype=np.int64)
        _raw(client, send, [ids, first.astype(np.int64)])
        with pytest.raises(envd.EnvStateError, match="in flight"):
            _raw(client, send, [ids, np.full(n, 6, np.int64)])
        with pytest.raises(envd.InvalidActionError, match=f"needs {8 * n} bytes"):
            _raw(client, send, [ids, np.zeros(3, np.int64)])
        reply = client.channel.request({"type": "recv", "session": env.session, "count": n,
                                 "inline": True})
        got = np.frombuffer(reply["_blobs"][0], np.int64)
        obs = np.frombuffer(reply["_blobs"][1 + reply["arrays"].index("observations")],
                            np.uint8).reshape(n, 6, 7, 2)
        with envd.make("ConnectFour-v0", n, seed=2, depth=8, num_threads=0) as local:
            local.reset()
            expected = local.step(first)[0]
        assert sorted(got.tolist()) == list(range(n))
        assert obs.tobytes() == expected[got].tobytes()


def test_async_reset_with_seeds_and_reset_masks_over_inline(daemon):
    """Reset inputs (seeds, masks) travel as frames: reseeding and partial
    resets give what they give in-process."""
    with daemon.connect() as client, \
            client.make("Acrobot-v1", 6, seed=1, autoreset_mode="disabled",
                        transport="inline") as env, \
            envd.make("Acrobot-v1", 6, seed=1, autoreset_mode="disabled", num_threads=0) as local:
        seeds = [11, 12, 13, 14, 15, 16]
        assert env.reset(seed=seeds)[0].tobytes() == local.reset(seed=seeds)[0].tobytes()
        rng = np.random.default_rng(0)
        for _ in range(5):
            actions = random_actions(local.single_action_space, 6, rng)
            assert env.step(actions)[0].tobytes() == local.step(actions)[0].tobytes()
        mask = np.array([True, False, True, False, False, True])
        r = env.reset(options={"reset_mask": mask})
        q = local.reset(options={"reset_mask": mask})
        assert r[0].tobytes() == q[0].tobytes()


def test_a_client_process_on_another_ipc_namespace_sees_the_same(daemon, tmp_path):
    """The same check from the client's side: a trainer whose /dev/shm is its
    own (a container that does not share the daemon's IPC namespace) gets the
    inline transport and the same results."""
    reason = _can_unshare_mount()
    if reason is not None:
        pytest.skip(f"{reason} (needs root or user namespaces)")
    script = tmp_path / "trainer.py"
    script.write_text(
        "import sys, numpy as np, envd\n"
        "c = envd.connect(sys.argv[1])\n"
        "env = c.make('Pendulum-v1', 3, seed=9)\n"
        "print(env.transport)\n"
        "env.reset()\n"
        "for t in range(30):\n"
        "    obs = env.step(np.full((3, 1), np.sin(t), np.float32))[0]\n"
        "print(obs.tobytes().hex())\n"
        "c.close()\n")
    command = ("mount -t tmpfs envd-test /dev/shm && exec "
               f"{sys.executable} {script} {daemon.endpoint}")
    out = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", command],
                         capture_output=True, text=True, timeout=DEADLINE, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    transport, obs_hex = out.stdout.split()
    assert transport == "inline"
    with envd.make("Pendulum-v1", 3, seed=9, num_threads=0) as local:
        local.reset()
        for t in range(30):
            obs = local.step(np.full((3, 1), np.sin(t), np.float32))[0]
    assert obs_hex == obs.tobytes().hex()
