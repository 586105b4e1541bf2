"""Start real daemon processes for tests, and wait for things without flakiness.

Every wait polls with a generous deadline (a loaded 2-core machine may be slow;
a fast one does not wait longer).  A daemon runs on a temporary ipc endpoint,
from a temporary working directory (so the checkout's envd/ folder never
shadows the installed package), and logs to a file the failing test prints.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import envd

#: Deadline of every wait in the integration tests (seconds).
DEADLINE = 60.0


def wait_until(condition: Callable[[], bool], timeout: float = DEADLINE, what: str = "condition") -> None:
    """Poll condition every 20 ms until it is true; AssertionError after timeout."""
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.02)


def segments_of(pid: int) -> list[str]:
    """The shared-memory segments of the daemon with this pid."""
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"envd-{pid}-"))


class DaemonProcess:
    """An `envd` daemon subprocess serving ipc://<folder>/envd.sock."""

    def __init__(self, folder: Path, *args: str, env: dict[str, str] | None = None):
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.endpoint = f"ipc://{folder}/envd.sock"
        self.log_path = folder / "envd.log"
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "envd.cli", "--bind", self.endpoint, *args],
            cwd=folder, stdout=self._log, stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})})
        self.pid = self.proc.pid
        try:
            wait_until(self._answers, what=f"the daemon at {self.endpoint} to answer")
        except BaseException:
            self.stop()
            raise

    def _answers(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"the daemon exited with {self.proc.returncode}:\n{self.log()}")
        try:
            with envd.connect(self.endpoint, timeout=2):
                return True
        except (envd.ConnectionLostError, envd.EnvdTimeoutError):
            return False

    def connect(self, timeout: float = 30.0) -> envd.Client:
        return envd.connect(self.endpoint, timeout=timeout)

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float = DEADLINE) -> int:
        return self.proc.wait(timeout)

    def stop(self) -> int:
        """SIGTERM, wait for the drain; SIGKILL if it does not exit in time."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(DEADLINE)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def __enter__(self) -> "DaemonProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
