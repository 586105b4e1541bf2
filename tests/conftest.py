"""Shared test helpers."""
from __future__ import annotations

import pytest


@pytest.fixture
def daemon(tmp_path):
    """A real daemon process (2 threads, 10 s lease) on a temporary ipc endpoint
    for one test; afterwards it must exit 0 on SIGTERM and leave no segment."""
    from support.daemon import DaemonProcess, segments_of
    with DaemonProcess(tmp_path / "daemon", "--threads", "2", "--lease-timeout", "10") as proc:
        yield proc
    assert proc.proc.returncode == 0, proc.log()
    assert segments_of(proc.pid) == []


@pytest.fixture
def harness(tmp_path):
    """Daemons, clients, processes and files of one test, cleaned up after it."""
    from support.daemon import Harness
    h = Harness(tmp_path)
    try:
        yield h
    finally:
        h.cleanup()
