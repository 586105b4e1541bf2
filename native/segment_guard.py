"""Session segments the daemon maps so that a client truncating one cannot kill it.

A client can ftruncate its session's file under /dev/shm at any moment; an
access past the new end of a shared mapping raises SIGBUS, which would end
the daemon and every session.  native/src/segment_guard.h installs a SIGBUS
handler that replaces such a mapping by private zero pages (the faulting
access then succeeds) and marks it revoked; the daemon then closes the
session.  A SIGBUS anywhere else still kills the process as before.

``map_segment`` maps a file through the guard; the buffer it returns (and
every numpy view of it) keeps the mapping alive, and the last one gone
unmaps it, so the guard's table never names memory that was given back.
"""
from __future__ import annotations

from envd.errors import LimitExceededError
from envd.native._envd_native import ffi, lib

_installed = False


def install() -> None:
    """Install the process-wide SIGBUS handler (once; later calls do nothing).
    Install it after Python's faulthandler, which it then chains to for
    faults outside the segments."""
    global _installed
    if not _installed:
        if lib.envd_segment_guard_install() != lib.ENVD_OK:
            raise OSError("cannot install the SIGBUS handler of the segment guard")
        _installed = True


def map_segment(fd: int, size: int):
    """Map size bytes of fd shared and read-write under the guard: a writable
    buffer (cffi) whose address the guard knows.  LimitExceededError when the
    guard's table is full; OSError when mmap fails."""
    install()
    out = ffi.new("void **")
    rc = lib.envd_segment_map(fd, size, out)
    if rc == lib.ENVD_ENOMEM:
        raise LimitExceededError(
            f"the daemon maps at most {lib.ENVD_SEGMENT_GUARD_SLOTS} session segments at once; "
            "close envs you no longer use")
    if rc != lib.ENVD_OK:
        raise OSError(ffi.errno, f"mapping a session segment of {size} bytes failed")
    address = ffi.gc(out[0], lib.envd_segment_unmap)
    return ffi.buffer(address, size)


def revoked(buffer) -> bool:
    """Whether the guard replaced this mapping (from map_segment) by zero
    pages: its file was truncated under it."""
    return lib.envd_segment_revoked(ffi.from_buffer(buffer)) == 1


def revocations() -> int:
    """Segments revoked in this process so far."""
    return int(lib.envd_segment_revocations())
