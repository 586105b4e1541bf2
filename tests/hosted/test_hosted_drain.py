"""Issue 38 N3: SIGTERM's drain ends after its own grace (--drain-grace),
whatever --hosted-timeout says.

A hosted make in flight held the drain until --hosted-timeout (23.9 s with
--hosted-timeout 25; the 60 s default equals the deploy files' grace
period, so the daemon could be SIGKILLed mid-drain).  Now what still runs in
hosted envs after the drain's grace is killed (their workers and the
template) and the daemon exits 0, every request answered, nothing left.
"""
from __future__ import annotations

import signal
import threading
import time

from envs import DAEMON_ENV, alive, descendants
from support.daemon import DEADLINE, DaemonProcess, segments_of, wait_until
from test_hosted_fair_share import HANGING, Hog

import envd

HANGING_RESET = "py:envd-test/HangingReset-v0"  # env 0 (seed 0) hangs in its reset


def test_sigterm_kills_a_hosted_make_and_reset_in_flight_after_the_drain_grace(tmp_path):
    # (the grace by its variable: a daemon without the flag ignores it, so
    # the same test shows the drain waiting for --hosted-timeout before)
    daemon = DaemonProcess(tmp_path / "d", "--threads", "2", "--lease-timeout", "60",
                           "--import", "daemon_envs", "--python-env", HANGING[3:],
                           "--python-env", HANGING_RESET[3:], "--hosted-timeout", "600",
                           env={**DAEMON_ENV, "ENVD_DRAIN_GRACE": "1"})
    hog = resetter = None
    try:
        resetter = daemon.connect(timeout=DEADLINE)
        hung = resetter.make(HANGING_RESET, 2, seed=0, num_workers=1)
        hog = Hog(daemon.endpoint)
        make = hog.make()
        outcome: list[BaseException] = []

        def reset() -> None:
            try:
                hung.reset()
            except BaseException as exc:  # noqa: BLE001 -- checked below
                outcome.append(exc)
        resetting = threading.Thread(target=reset, daemon=True)
        resetting.start()
        with daemon.connect(timeout=DEADLINE) as watcher:
            wait_until(lambda: watcher.status()["operations"]["running"] == 2,
                       what="the make and the reset to run")
        processes = descendants(daemon.pid)  # the template and both sessions' workers
        assert len(processes) >= 3, processes
        started = time.monotonic()
        daemon.proc.send_signal(signal.SIGTERM)
        code = daemon.proc.wait(DEADLINE)  # far less than --hosted-timeout
        took = time.monotonic() - started
        print(f"\nSIGTERM with a hosted make and reset in flight: exited after {took:.1f} s")
        log = daemon.log()
        assert code == 0, log
        assert "--drain-grace" in log, log
        reply = hog.recv()
        assert reply["id"] == make and reply["code"] == "env_error", reply
        resetting.join(DEADLINE)
        assert isinstance(outcome[0], envd.EnvError), outcome  # answered: its workers died
        wait_until(lambda: not any(alive(pid) for pid in processes),
                   what="the template and the workers to die")
        assert segments_of(daemon.pid) == []
    finally:
        if hog is not None:
            hog.close()
        if resetter is not None:
            resetter.timeout = 2.0
            resetter.close()
        daemon.stop()
