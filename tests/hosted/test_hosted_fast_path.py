"""Hosted Python envs on the daemon's fast path (the doorbell served by a
native thread, native/src/doorbell.h): a dead worker fails the pending call
within a second instead of holding the doorbell's thread, the daemon serves
its other sessions meanwhile, and a close or a lease expiry with the fast
path on leaves no worker, segment or descriptor behind.  (Equivalence with
SyncVectorEnv through the fast path: test_hosted_daemon's "fast" client.)"""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from envs import HANG_MARKER_VARIABLE, alive, wait_until
from support.daemon import segments_of
from test_hosted_daemon import descendants, start

import envd
from envd.client.doorbell import STEP
from envd.shm import HEADER_SIZE, SHM_DIR


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def new_workers(daemon_pid: int, before: set[int]) -> list[int]:
    return sorted(set(descendants(daemon_pid)) - before)


@pytest.fixture
def hang_marker(tmp_path: Path) -> Path:
    """The file a HangingEnv of the daemon below creates as it starts to hang."""
    return tmp_path / "hung"


@pytest.fixture
def daemon(tmp_path: Path, hang_marker: Path):
    proc = start(tmp_path / "d", "--lease-timeout", "3",
                 variables={HANG_MARKER_VARIABLE: str(hang_marker)})
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.log()


def test_worker_killed_under_a_pending_fast_path_step(daemon, hang_marker: Path):
    """The doorbell's thread waits for a hung env's step; SIGKILL of its
    worker (the OOM killer's way) makes that step raise envd.EnvError naming
    the worker within a second, every later call too, and the daemon serves
    its other sessions (on the fast path as well) all along."""
    with daemon.connect() as c:
        other = c.make("py:CartPole-v1", 2, seed=0, num_workers=1, fast_path=True)
        other.reset()
        before = set(descendants(daemon.pid))
        env = c.make("py:envd-test/Hanging-v0", 2, seed=0, num_workers=2, fast_path=True)
        assert env.fast_path
        workers = new_workers(daemon.pid, before)
        assert len(workers) == 2, workers
        env.reset()
        env.step(np.zeros(2, np.int64))
        killed_at: list[float] = []

        def kill_worker_0() -> None:  # once the step below hangs in env 0
            assert wait_until(hang_marker.exists, 60)
            os.kill(workers[0], signal.SIGKILL)
            killed_at.append(time.monotonic())

        killer = threading.Thread(target=kill_worker_0)
        killer.start()
        with pytest.raises(envd.EnvError,
                           match=r"py:envd-test/Hanging-v0: worker 0 \(pid \d+, envs 0\.\.0\) "
                                 r"died; close this env") as caught:
            env.step(np.zeros(2, np.int64))  # env 0's second step sleeps an hour
        raised_at = time.monotonic()
        killer.join()
        assert killed_at and raised_at - killed_at[0] < 1.0, (raised_at, killed_at)
        assert caught.value.env_index == 0
        with pytest.raises(envd.EnvError, match="died"):
            env.step(np.zeros(2, np.int64))
        assert other.step(np.ones(2, np.int64))[0].shape == (2, 4)
        env.close()
        assert wait_until(lambda: not any(map(alive, workers)), 60), workers
        assert other.step(np.ones(2, np.int64))[0].shape == (2, 4)
        other.close()


def test_env_exception_on_the_fast_path_is_the_socket_paths_env_error(daemon):
    """An env that raises: the fast path's EnvError names the env, the
    exception's type and message, as over the socket."""
    with daemon.connect() as c:
        for fast in (True, False):
            env = c.make("py:envd-test/Raising-v0", 4, seed=0, num_workers=2, fast_path=fast)
            assert env.fast_path == fast
            env.reset()
            for _ in range(2):
                env.step(np.zeros(4, np.int64))
            with pytest.raises(envd.EnvError,
                               match="py:envd-test/Raising-v0: env 2 raised ValueError: boom "
                                     "at step 3") as caught:
                env.step(np.zeros(4, np.int64))
            assert caught.value.env_index == 2
            assert env.reset()[0].shape == (4, 2)  # the session goes on after a reset
            env.close()


@pytest.mark.parametrize("how", ["close", "close while a step hangs",
                                 "close while a sent batch hangs", "lease expiry"])
def test_fast_path_session_leaves_nothing(daemon, how):
    """Close (also while the doorbell's thread waits for a hung env) and
    lease expiry of a hosted session on the fast path: its workers exit, its
    segment goes, the daemon holds no more descriptors than before the make,
    and its other sessions go on."""
    with daemon.connect() as c, daemon.connect(timeout=2) as victim:
        other = c.make("py:CartPole-v1", 2, seed=0, num_workers=1, fast_path=True)
        other.reset()
        segments, fds = segments_of(daemon.pid), open_fds(daemon.pid)
        before = set(descendants(daemon.pid))
        env_id = "py:envd-test/Hanging-v0" if how != "close" else "py:Acrobot-v1"
        batch = {"batch_size": 3} if "batch" in how else {}
        env = victim.make(env_id, 3, seed=0, num_workers=2, fast_path=True, **batch)
        workers = new_workers(daemon.pid, before)
        assert len(workers) == 2 and env.fast_path
        assert len(segments_of(daemon.pid)) == len(segments) + 1
        if batch:
            env.async_reset()
            env.recv()
            env.send(np.zeros(3, np.int64), np.arange(3))
            env.recv()
            env.send(np.zeros(3, np.int64), np.arange(3))  # env 0's second step hangs
        else:
            env.reset()
            env.step(np.zeros(3, np.int64))
        if how == "close":
            env.close()
        elif how == "close while a step hangs":
            with pytest.raises(envd.EnvdTimeoutError):
                env.step(np.zeros(3, np.int64))  # env 0's second step sleeps an hour
            started = time.monotonic()
            env.close()
            # (the daemon's loop never waited for the hung request)
            assert other.step(np.ones(2, np.int64))[0].shape == (2, 4)
            assert time.monotonic() - started < 10
        elif batch:
            started = time.monotonic()
            env.close()
            assert other.step(np.ones(2, np.int64))[0].shape == (2, 4)
            assert time.monotonic() - started < 10
        else:
            victim.channel.stop_heartbeat()  # alive, silent: the lease (3 s) expires
        assert wait_until(lambda: not any(map(alive, workers)), 60), workers
        assert wait_until(lambda: segments_of(daemon.pid) == segments, 60)
        assert wait_until(lambda: open_fds(daemon.pid) <= fds, 60), (open_fds(daemon.pid), fds)
        assert wait_until(lambda: c.status()["sessions"] == 1, 60)
        assert other.step(np.ones(2, np.int64))[0].shape == (2, 4)
        other.close()


def test_truncated_segment_on_the_fast_path(daemon):
    """A client that truncates its hosted session's segment (to the header
    page) and rings the doorbell: the backend's copies of its rows, on the
    doorbell's thread, fault on the truncated file; the daemon lives (its
    segment guard), closes the session (its workers and segment go, the
    doorbell says closed) and serves its other sessions."""
    with daemon.connect() as c:
        other = c.make("py:CartPole-v1", 2, seed=0, num_workers=1, fast_path=True)
        other.reset()
        before = set(descendants(daemon.pid))
        env = c.make("py:Acrobot-v1", 64, seed=0, num_workers=2, fast_path=True)
        workers = new_workers(daemon.pid, before)
        env.reset()
        name = env._segment.name
        with open(os.path.join(SHM_DIR, name), "r+b") as f:
            os.ftruncate(f.fileno(), HEADER_SIZE)
        bell = env._stepper.doorbell  # (this process touches the header page only)
        bell.ring(STEP, 0)
        answer = bell.wait(time.monotonic() + 60, lambda: None)
        assert answer is None and bell.closed, answer
        assert wait_until(lambda: name not in segments_of(daemon.pid), 60)
        assert wait_until(lambda: not any(map(alive, workers)), 60), workers
        assert daemon.proc.poll() is None
        assert "truncated its shared-memory segment" in daemon.log()
        assert other.step(np.ones(2, np.int64))[0].shape == (2, 4)
        other.close()


def test_a_hung_fast_path_request_never_stops_the_daemon(daemon, hang_marker: Path):
    """The doorbell's thread holds a hosted session's lock for the whole
    step it serves, which a hung env never ends: a "fast off" request and
    socket resets of that session are refused as busy (the event loop and
    the executor never wait for that lock), the daemon serves its other
    clients all along, the fast path stays on (no worker killed), and a
    close still frees the session."""
    with daemon.connect(timeout=60) as c, daemon.connect(timeout=60) as victim:
        before = set(descendants(daemon.pid))
        env = victim.make("py:envd-test/Hanging-v0", 2, seed=0, num_workers=2, fast_path=True)
        workers = new_workers(daemon.pid, before)
        env.reset()
        env.step(np.zeros(2, np.int64))

        def step_refused() -> None:
            with pytest.raises(envd.EnvdError):
                env.step(np.zeros(2, np.int64))

        hung = threading.Thread(target=step_refused, daemon=True)
        hung.start()  # env 0's second step sleeps an hour
        assert wait_until(lambda: c.status()["sessions"] == 1, 60)
        # env 0's worker got the step, so the doorbell's thread serves it
        # now, holding the session's lock until the step ends
        assert wait_until(hang_marker.exists, 60)
        refused_from = time.monotonic()
        with pytest.raises(envd.EnvStateError, match="fast path is serving a request"):
            victim.fast(env.session, enable=False)
        assert time.monotonic() - refused_from < 20  # (at once: the loop never waited)
        for _ in range(3):  # more than the executor's threads
            with pytest.raises(envd.EnvStateError, match="fast path is serving a request"):
                victim.channel.request({"type": "reset", "session": env.session})
        started = time.monotonic()
        assert c.status()["sessions"] == 1
        other = c.make("py:CartPole-v1", 2, seed=0, num_workers=1)
        assert other.reset()[0].shape == (2, 4)
        assert time.monotonic() - started < 30
        assert all(map(alive, workers)), workers  # "fast off" killed nothing
        other.close()
        victim.channel.timeout = 60
        victim.close_session(env.session)
        assert wait_until(lambda: not any(map(alive, workers)), 60), workers
        assert wait_until(lambda: c.status()["sessions"] == 0, 60)


def test_fast_off_of_an_idle_hosted_session_keeps_its_workers(daemon):
    """Turning the fast path off (no request running) stops the doorbell
    only: the session's workers live on and it steps over the socket."""
    with daemon.connect() as c:
        before = set(descendants(daemon.pid))
        env = c.make("py:CartPole-v1", 2, seed=0, num_workers=2, fast_path=True)
        workers = new_workers(daemon.pid, before)
        env.reset()
        env.step(np.ones(2, np.int64))
        c.fast(env.session, enable=False)
        reply = c.channel.request({"type": "reset", "session": env.session})
        assert reply["ok"]
        assert all(map(alive, workers)), workers
        env.close()
