"""Startup cleanup: segments a dead daemon left in /dev/shm (e.g. after kill -9).

A daemon names its segments ``envd-<pid>-<random>`` (see envd.shm), so a
segment is stale when no envd daemon runs under that pid any more.  A live
pid whose command line does not mention envd was reused by another program:
its segments are stale too.  Only our own user's files are touched.
"""
from __future__ import annotations

import logging
import os

from envd.shm import NAME_PREFIX, SHM_DIR, segment_prefix

log = logging.getLogger("envd.server")


def _daemon_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's: not ours to judge
        return True
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"envd" in f.read()
    except OSError:
        return True


def remove_stale_segments(shm_dir: str = SHM_DIR) -> list[str]:
    """Unlink our user's envd segments whose daemon is gone; return their names."""
    removed = []
    try:
        names = os.listdir(shm_dir)
    except FileNotFoundError:
        return removed
    for name in names:
        if not name.startswith(NAME_PREFIX):
            continue
        pid_text = name[len(NAME_PREFIX):].split("-", 1)[0]
        if not pid_text.isdigit() or int(pid_text) == os.getpid() or _daemon_alive(int(pid_text)):
            continue
        path = os.path.join(shm_dir, name)
        try:
            if os.lstat(path).st_uid != os.getuid():
                continue
            os.unlink(path)
        except FileNotFoundError:
            continue
        removed.append(name)
    if removed:
        log.info("removed %d segment(s) left behind by dead daemons: %s",
                 len(removed), ", ".join(removed))
    return removed


def remove_own_segments(shm_dir: str = SHM_DIR) -> None:
    """Unlink every segment of this process (a forced exit: no time to free
    sessions one by one, and some may still be in the making)."""
    prefix = segment_prefix()
    for name in os.listdir(shm_dir):
        if name.startswith(prefix):
            try:
                os.unlink(os.path.join(shm_dir, name))
            except OSError:
                pass
