"""What a killed benchmark must not leave behind: its daemons, its other
child processes and its temporary folders, torn down on SIGTERM (a CI
timeout, ``kill``).

The run ends in the signal handler itself, not by an exception raised into
whatever it was running.  That code may be a peer's (SB3's SubprocVecEnv,
gymnasium's AsyncVectorEnv, PufferLib's Multiprocessing): unwinding through
it runs its own close, which can wait forever for replies its workers will
never send (seen: SubprocVecEnv interrupted mid-step), or a catch-all of
its may swallow the exception (seen: a run killed with SIGTERM that went on
to the end and exited 0).  So the handler:

1. sends SIGTERM to every registered daemon (a daemon drains and removes
   its shared-memory segments) and SIGKILLs one that has not exited
   DAEMON_GRACE_SECONDS later;
2. SIGKILLs every other process descended from this one (peers' workers,
   forkservers, the PufferLib child's process group): nothing of theirs
   outlives the run, and an in-process envd session holds only memfds;
3. removes the registered folders;
4. exits at once with 128 + SIGTERM, as a shell reports a killed command.

^C (SIGINT) keeps Python's KeyboardInterrupt: a person at the terminal sees
the unwinding and can press it again.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

#: How long a daemon may take to drain after SIGTERM before it is killed.
DAEMON_GRACE_SECONDS = 30.0

_daemons: list[subprocess.Popen] = []
_folders: list[str] = []
#: The process that installed the handler: a child forked from it (a peer's
#: multiprocessing worker, which its own close may SIGTERM) inherits the
#: handler and these lists, and must die as SIGTERM's default would.
_owner_pid: int | None = None


def install() -> None:
    """Make SIGTERM end this process through teardown()."""
    global _owner_pid
    _owner_pid = os.getpid()
    signal.signal(signal.SIGTERM, _on_sigterm)


@contextlib.contextmanager
def daemon(proc: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """Register proc (a daemon of the run) for the block's duration."""
    _daemons.append(proc)
    try:
        yield proc
    finally:
        _daemons.remove(proc)


@contextlib.contextmanager
def temporary_folder(prefix: str) -> Iterator[str]:
    """tempfile.TemporaryDirectory(prefix=prefix), registered: removed on
    exit from the block and by teardown()."""
    with tempfile.TemporaryDirectory(prefix=prefix) as folder:
        _folders.append(folder)
        try:
            yield folder
        finally:
            _folders.remove(folder)


def _on_sigterm(signum: int, _frame: Any) -> None:
    if os.getpid() != _owner_pid:  # a forked child: not the run's to tear down
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: a second SIGTERM waits for this one
    print("envd bench: terminated", file=sys.stderr, flush=True)
    teardown()
    os._exit(128 + signum)


def teardown() -> None:
    """Steps 1-3 of the module's docstring (the caller exits after).

    The daemons are signalled and reaped with os.kill and os.waitpid, never
    Popen's methods: the handler may interrupt the main thread inside a
    Popen.wait, which holds that Popen's lock, and a wait here would then
    block on it for good."""
    # (returncode: an attribute, no lock; a daemon reaped already is skipped,
    # its pid may be another process's by now)
    daemons = [proc.pid for proc in _daemons if proc.returncode is None]
    for pid in daemons:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + DAEMON_GRACE_SECONDS
    running = set(daemons)
    while running and time.monotonic() < deadline:
        running = {pid for pid in running if not _reaped(pid)}
        if running:
            time.sleep(0.05)
    for pid in running:  # (init reaps them once this process exits)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    _kill_descendants()
    for folder in _folders:
        shutil.rmtree(folder, ignore_errors=True)


def _reaped(pid: int) -> bool:
    """Whether child pid has exited (reaped now, or already by someone)."""
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:  # reaped already (its Popen's wait)
        return True


def descendants(pid: int) -> list[int]:
    """Every live process descended from pid (children before their own),
    from /proc's parent links."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # it exited meanwhile
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        parent = int(stat[stat.rindex(b")") + 2:].split()[1])
        children.setdefault(parent, []).append(int(name))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(), ()):
            found.append(child)
            queue.append(child)
    return found


def _kill_descendants() -> None:
    # Twice: a process that a parent forked while the first pass ran (before
    # its parent was killed) is found by the second.  (Our exit hands the
    # killed children to init, which reaps them.)
    for _ in range(2):
        for pid in descendants(os.getpid()):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
