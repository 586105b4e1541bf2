"""Which shared-memory segments belong to a live daemon, and cleanup of the rest.

A daemon instance has a name ``<pid>-<random nonce>``; its segments are
``/dev/shm/envd-<pid>-<nonce>-<session>`` and it holds an exclusive flock on
``/dev/shm/.envd-<pid>-<nonce>.lock`` for as long as it lives.  The kernel
drops the lock when the process dies, however it dies, so a segment is stale
exactly when its instance's lock file is missing or can be locked.  This
holds across PID namespaces (containers sharing /dev/shm, a daemon that is
PID 1 again after a restart), where a pid says nothing.

A daemon given a namespace (--shm-namespace N) names its instance
``N-<pid>-<nonce>``, and its startup sweep looks at namespace N's entries
only, as a daemon without one looks at those without one: daemons of
different namespaces never remove each other's dead daemons' segments (a
test that plants or leaves segments for its own next daemon to sweep is not
raced by every other daemon starting on the host).  A namespace is a
lowercase letter and up to 15 more lowercase letters or digits, so its
entries never parse as another namespace's, nor as a pid's.
"""
from __future__ import annotations

import fcntl
import logging
import os
import re
import secrets
import stat

from envd.shm import NAME_PREFIX, SHM_DIR

log = logging.getLogger("envd.server")


#: What --shm-namespace takes (its bound: SECURITY.md).
NAMESPACE = re.compile(r"[a-z][a-z0-9]{0,15}")


def check_namespace(namespace: str) -> str:
    """namespace if it is one ("" is none), else ValueError."""
    if namespace and NAMESPACE.fullmatch(namespace) is None:
        raise ValueError(f"--shm-namespace (ENVD_SHM_NAMESPACE) must be a lowercase letter and up "
                         f"to 15 more lowercase letters or digits, got {namespace[:40]!r}")
    return namespace


def _prefix(namespace: str) -> str:
    """The names of namespace's segments start with this ("": none)."""
    return f"{NAME_PREFIX}{namespace}-" if namespace else NAME_PREFIX


def _lock_path(instance: str, shm_dir: str) -> str:
    return os.path.join(shm_dir, f".{NAME_PREFIX}{instance}.lock")


class Instance:
    """This daemon's name and the lock that marks its segments as alive."""

    def __init__(self, shm_dir: str = SHM_DIR, namespace: str = ""):
        namespace = check_namespace(namespace)
        self.name = (f"{namespace}-" if namespace else "") + f"{os.getpid()}-{secrets.token_hex(4)}"
        self.segment_prefix = f"{NAME_PREFIX}{self.name}-"
        self.shm_dir = shm_dir
        self.lock_path = _lock_path(self.name, shm_dir)
        # Lock a temporary file, then rename it into place: a cleaner never
        # sees this instance's lock file unlocked.
        temporary = f"{self.lock_path}.{secrets.token_hex(4)}"
        self._fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(temporary, self.lock_path)

    def remove_own_segments(self) -> None:
        """Unlink every segment of this instance (a forced exit: no time to free
        sessions one by one, and some may still be in the making)."""
        for name in os.listdir(self.shm_dir):
            if name.startswith(self.segment_prefix):
                try:
                    os.unlink(os.path.join(self.shm_dir, name))
                except OSError:
                    pass

    def release(self) -> None:
        """Remove the lock file (after the segments are gone) and drop the lock."""
        if self._fd >= 0:
            try:
                os.unlink(self.lock_path)
            except FileNotFoundError:
                pass
            os.close(self._fd)
            self._fd = -1


def _instance_of(name: str, namespace: str) -> str | None:
    """The instance ('<pid>-<nonce>', after '<namespace>-' if any) of a
    segment or lock file name of namespace, else None."""
    prefix = _prefix(namespace)
    before = f"{namespace}-" if namespace else ""
    if name.startswith("." + prefix) and name.endswith(".lock"):
        parts = name[len(prefix) + 1:-len(".lock")].split("-")
        return before + "-".join(parts) if len(parts) == 2 else None
    if name.startswith(prefix):
        parts = name[len(prefix):].split("-")
        return before + "-".join(parts[:2]) if len(parts) == 3 else None
    return None


def _not_ours(path: str) -> str | None:
    """Why the sweep must leave the entry at path alone (None: it is a regular
    file of this daemon's user, not a symlink: lstat never follows one)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "gone"
    return _why_not_ours(st)


def _why_not_ours(st: os.stat_result) -> str | None:
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not this daemon's {os.geteuid()}"
    return None


def _alive(instance: str, shm_dir: str, skipped: list[str]) -> tuple[bool, int]:
    """Whether the instance's daemon holds its lock (or the lock is not ours
    to judge: then its segments are left alone too); a held lock of ours to
    release."""
    path = _lock_path(instance, shm_dir)
    why = _not_ours(path)
    if why == "gone":
        return False, -1
    if why is not None:  # e.g. another user's, perhaps planted to stop us
        skipped.append(f"{os.path.basename(path)} ({why})")
        return True, -1
    try:  # O_NOFOLLOW, then fstat: the file checked is the file opened
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return False, -1
    except OSError as exc:
        skipped.append(f"{os.path.basename(path)} ({exc.strerror})")
        return True, -1
    why = _why_not_ours(os.fstat(fd))
    if why is not None:  # swapped after the lstat
        os.close(fd)
        skipped.append(f"{os.path.basename(path)} ({why})")
        return True, -1
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return True, -1
    return False, fd


def _unlink(path: str, skipped: list[str]) -> bool:
    """Remove a stale entry of ours; whether it was removed."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    except OSError as exc:  # e.g. EPERM: /dev/shm is sticky
        skipped.append(f"{os.path.basename(path)} ({exc.strerror})")
        return False
    return True


#: Skipped entries named in the startup warning (the rest are counted).
_NAMED_SKIPS = 20


def remove_stale_segments(shm_dir: str = SHM_DIR, namespace: str = "") -> list[str]:
    """Unlink our user's envd segments (and lock files) of daemons of
    namespace ("": none) that are gone; return the segment names removed.
    Entries that only look like envd's -- another user's, a symlink, one we
    cannot remove -- are left in place and named in one warning: anyone can
    create files in /dev/shm, and such a file must never stop the daemon
    from starting."""
    removed: list[str] = []
    skipped: list[str] = []
    try:
        names = os.listdir(shm_dir)
    except FileNotFoundError:
        return removed
    verdicts: dict[str, tuple[bool, int]] = {}
    prefix = _prefix(check_namespace(namespace))
    for name in names:
        if not name.startswith((prefix, "." + prefix)):
            continue
        instance = _instance_of(name, namespace)
        if instance is None:
            continue  # not named by a daemon: not ours to remove
        if instance not in verdicts:
            verdicts[instance] = _alive(instance, shm_dir, skipped)
        if verdicts[instance][0] or name.startswith("."):
            continue  # alive, or a lock file: those go last, below
        path = os.path.join(shm_dir, name)
        why = _not_ours(path)
        if why is not None:
            if why != "gone":
                skipped.append(f"{name} ({why})")
            continue
        if _unlink(path, skipped):
            removed.append(name)
    for instance, (alive, fd) in verdicts.items():
        if not alive and fd >= 0:  # we hold the dead daemon's lock: remove it
            _unlink(_lock_path(instance, shm_dir), skipped)
            os.close(fd)
    if removed:
        log.info("removed %d segment(s) left behind by dead daemons: %s",
                 len(removed), ", ".join(removed))
    if skipped:
        more = len(skipped) - _NAMED_SKIPS
        log.warning("left %d entr%s in %s that look like envd's but are not this daemon's to "
                    "remove (another user's, not a regular file, or not removable): %s%s",
                    len(skipped), "y" if len(skipped) == 1 else "ies", shm_dir,
                    ", ".join(skipped[:_NAMED_SKIPS]), f" and {more} more" if more > 0 else "")
    return removed
