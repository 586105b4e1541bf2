"""A hung hosted env never holds the daemon (REVIEW_ISSUE17.md items 2, 3):
a make or reset that hangs ends after --hosted-timeout with its workers
killed (the daemon's two operation threads are not held); SIGTERM ends a
daemon whose hosted step or batch hangs; a close whose workers do not exit
never stalls the event loop for the other clients."""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from envs import DAEMON_ENV, alive, descendants, wait_until
from support.daemon import DaemonProcess, segments_of

import envd

ALLOWED = ("CartPole-v1", "envd-test/Hanging-v0", "envd-test/HangingReset-v0",
           "envd-test/HangingMake-v0", "envd-test/SlowClose-v0")
ENV = DAEMON_ENV


def start(folder: Path, *extra: str) -> DaemonProcess:
    return DaemonProcess(folder, "--threads", "1", "--lease-timeout", "30", "--import",
                         "daemon_envs", *(a for i in ALLOWED for a in ("--python-env", i)),
                         *extra, env=ENV)



def test_a_hung_reset_or_make_ends_after_the_hosted_timeout(tmp_path):
    """Two hung resets and a hung make (more than the daemon's two operation
    threads) each fail with EnvError after --hosted-timeout, their workers
    killed; the session says it must be closed; makes and resets go on."""
    proc = start(tmp_path / "d", "--hosted-timeout", "2")
    try:
        with proc.connect(timeout=60) as c:
            (template,) = descendants(proc.pid)
            fds = lambda: len(os.listdir(f"/proc/{proc.pid}/fd"))  # noqa: E731
            c.status()
            baseline = fds()
            hung = [c.make("py:envd-test/HangingReset-v0", 2, seed=0, num_workers=1)
                    for _ in range(2)]
            for env in hung:
                started = time.monotonic()
                with pytest.raises(envd.EnvError, match=r"waited longer than 2 s .*killed"):
                    env.reset()  # env 0 (seed 0) hangs in its reset
                assert time.monotonic() - started < 30
                with pytest.raises(envd.EnvError, match="close this env"):
                    env.reset()  # its state: the workers are gone
            with pytest.raises(envd.EnvError, match=r"longer than 2 s; the workers were killed"):
                c.make("py:envd-test/HangingMake-v0", 2, num_workers=1)
            with c.make("py:CartPole-v1", 2, num_workers=1) as env:  # the executor is free
                assert env.reset(seed=0)[0].shape == (2, 4)
            for env in hung:
                env.close()
            assert wait_until(lambda: descendants(proc.pid) == [template], 60), \
                descendants(proc.pid)
            assert wait_until(lambda: fds() <= baseline, 30), (fds(), baseline)  # no pidfd left
    finally:
        pid = proc.pid
        assert proc.stop() == 0, proc.log()
    assert segments_of(pid) == []


@pytest.mark.parametrize("call", ["step", "send"])
def test_sigterm_ends_a_daemon_whose_hosted_call_hangs(tmp_path, call):
    proc = start(tmp_path / "d")
    try:
        c = proc.connect(timeout=3)
        env = c.make("py:envd-test/Hanging-v0", 2, seed=0, num_workers=1,
                     batch_size=2 if call == "send" else None)
        actions = np.zeros(2, np.int64)
        with pytest.raises(envd.EnvdTimeoutError):
            if call == "step":
                env.reset()
                for _ in range(2):
                    env.step(actions)  # env 0's second step sleeps an hour
            else:
                env.async_reset()
                for _ in range(3):  # (the third recv waits for env 0's second step)
                    env.recv()
                    env.send(actions, np.arange(2))
        tree = descendants(proc.pid)
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(90) == 0, proc.log()  # the drain kills the hung call's workers
        assert wait_until(lambda: not any(map(alive, tree)), 30), [p for p in tree if alive(p)]
    finally:
        proc.stop()


def test_closing_a_session_whose_workers_do_not_exit_stalls_no_one(tmp_path):
    """SlowClose's env.close hangs, so its worker ignores the exit request;
    the daemon waits for it on its event loop (SIGKILL after the grace), not
    in the close handler: other clients are served meanwhile."""
    proc = start(tmp_path / "d")
    try:
        with proc.connect() as c, proc.connect() as other_client:
            other = other_client.make("py:CartPole-v1", 2, seed=0, num_workers=1)
            other.reset()
            before = set(descendants(proc.pid))
            env = c.make("py:envd-test/SlowClose-v0", 2, seed=0, num_workers=1)
            (worker,) = set(descendants(proc.pid)) - before
            env.reset()
            closed = threading.Event()

            def close() -> None:
                env.close()
                closed.set()
            closer = threading.Thread(target=close)
            closer.start()
            # the close is under way: the daemon took the session out of its books
            assert wait_until(lambda: other_client.status()["sessions"] == 1, 60)
            latencies = []
            for _ in range(10):
                started = time.monotonic()
                other.step(np.zeros(2, np.int64))
                latencies.append(time.monotonic() - started)
            closer.join(60)
            assert closed.is_set()
            # (the old close held the loop for the 5 s grace)
            assert max(latencies) < 2.5, latencies
            assert wait_until(lambda: not alive(worker), 60)  # killed after the grace
            assert wait_until(lambda: c.status()["sessions"] == 1, 30)
            other.close()
    finally:
        pid = proc.pid
        assert proc.stop() == 0, proc.log()
    assert segments_of(pid) == []


def test_max_workers_counts_workers_until_they_are_reaped(tmp_path):
    """Issue 38: a closed session's workers still count against --max-workers
    until they exited (a worker whose env's close hangs lives on until the
    reaper's SIGKILL): make/close loops of such an env never hold more
    workers than the limit."""
    proc = start(tmp_path / "d", "--max-workers", "2")
    try:
        with proc.connect() as c:
            before = set(descendants(proc.pid))
            env = c.make("py:envd-test/SlowClose-v0", 2, seed=0, num_workers=2)
            workers = set(descendants(proc.pid)) - before
            assert len(workers) == 2
            env.reset()
            env.close()  # its workers are told to exit; their env's close hangs
            try:
                extra = c.make("py:CartPole-v1", 2, seed=0, num_workers=1)
            except envd.LimitExceededError as exc:
                assert "--max-workers" in str(exc)
                assert c.status()["workers"] == 2
            else:  # only if the reaper's grace (5 s) passed before the make was served
                assert not any(alive(pid) for pid in workers), "over --max-workers"
                extra.close()
            assert wait_until(lambda: not any(alive(pid) for pid in workers), 60)  # reaped
            assert wait_until(lambda: c.status()["workers"] == 0, 60)
            with c.make("py:CartPole-v1", 2, seed=0, num_workers=2) as again:
                again.reset()
    finally:
        pid = proc.pid
        assert proc.stop() == 0, proc.log()
    assert segments_of(pid) == []
