"""A session's shared-memory segment: layout, creation (daemon) and attach (client).

One file under /dev/shm per session, created by the daemon with mode 0600 and
an unguessable name ``envd-<daemon pid>-<daemon nonce>-<128 random bits>``
(see envd.server.stale_segments for how the daemon's liveness is told).
Layout::

    offset 0     header page (HEADER_SIZE bytes)
                   0  magic        8 bytes  b"ENVDSHM1"
                   8  layout       u32      LAYOUT_VERSION
                  12  header size  u32
                  16  total size   u64
                  24  step_seq     u64      steps started (the daemon bumps it at submit)
                  32  done_seq     u64      steps completed (bumped before the reply)
                  64  session id   32 bytes ASCII hex
                 128  the fast path's doorbell (DOORBELL_OFFSET: ENVD_DOORBELL_OFFSET,
                      envd_doorbell_header_t of native/src/doorbell.h; envd.client.doorbell)
    HEADER_SIZE  the batch arrays, each starting on a 64-byte cache line, in the
                 order of envd.buffer_layout; where each one lies is
                 sent to the client in the make reply (name -> offset, dtype, shape).

The sequence counters count the socket path's steps and resets: step_seq is
bumped when the daemon submits one, done_seq before its reply, so step_seq >
done_seq while one is in flight (the fault tests read them to see it).  The
same-host fast path does not use them: its doorbell lies further in the
header page (DOORBELL_OFFSET, generated from native/src/doorbell.h's
ENVD_DOORBELL_OFFSET; its fields: envd.client.doorbell).

Attaching maps the file with mmap directly rather than through
multiprocessing.shared_memory, whose resource tracker would unlink the
segment when the client exits.  A mapping outlives the file's name, so arrays
a trainer still holds stay valid memory after the daemon frees the session.
"""
from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

from envd import _native_facts
from envd.errors import SharedMemoryError, UntrustedSegmentError
from envd.ownership import untrusted_reason

SHM_DIR = "/dev/shm"
NAME_PREFIX = "envd-"
MAGIC = b"ENVDSHM1"
LAYOUT_VERSION = 1
HEADER_SIZE = 4096
ALIGN = 64
_HEADER = struct.Struct("<8sIIQ")
_STEP_SEQ, _DONE_SEQ = 24, 32
_SESSION_OFFSET, _SESSION_LEN = 64, 32
#: Where the doorbell lies in the header page (generated from native/src/doorbell.h;
#: tests/native/test_facts.py checks that it fits between the session id and
#: the arrays).
DOORBELL_OFFSET = _native_facts.DOORBELL_OFFSET


def plan(layout: dict[str, tuple[tuple[int, ...], np.dtype]]) -> tuple[dict[str, list], int]:
    """Offsets of the arrays after the header page: ({name: [offset, dtype str,
    shape]}, total size in bytes)."""
    arrays, offset = {}, HEADER_SIZE
    for name, (shape, dtype) in layout.items():
        dtype = np.dtype(dtype)
        offset = -(-offset // ALIGN) * ALIGN
        arrays[name] = [offset, dtype.str, list(shape)]
        offset += int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return arrays, -(-offset // ALIGN) * ALIGN


def _check_layout(arrays: dict[str, list], size: int) -> None:
    """Every array of a layout the daemon sent lies after the header and within size."""
    for key, (offset, dtype, shape) in arrays.items():
        end = offset + int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if offset < HEADER_SIZE or end > size:
            raise SharedMemoryError(f"the daemon placed array {key!r} outside the segment")


class Segment:
    """One mapped segment and numpy views of its arrays (``arrays[name]``)."""

    def __init__(self, name: str, buf: mmap.mmap, arrays: dict[str, list]):
        self.name = name
        self.path: str | None = os.path.join(SHM_DIR, name)
        self.size = len(buf)
        self._mmap = buf
        self.arrays: dict[str, np.ndarray] = {
            key: np.frombuffer(buf, np.dtype(dtype), int(np.prod(shape, dtype=np.int64)),
                               offset).reshape(shape)
            for key, (offset, dtype, shape) in arrays.items()}
        self._counters = np.frombuffer(buf, np.uint64, 2, _STEP_SEQ)

    # ---- daemon side ---------------------------------------------------------------
    @classmethod
    def create(cls, name: str, session_id: str, arrays: dict[str, list], size: int,
               mapper: Callable[[int, int], Any] = mmap.mmap) -> Segment:
        """Create and map the file (mode 0600, never an existing one) and write
        the header.  The pages are allocated up front, so a full /dev/shm is an
        OSError now rather than a SIGBUS in a worker thread later.  mapper(fd,
        size) maps it: the daemon passes envd.native.segment_guard.map_segment,
        whose mapping survives the client truncating the file (which it can do
        at any moment, from the moment the name exists)."""
        path = os.path.join(SHM_DIR, name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.posix_fallocate(fd, 0, size)
            buf = mapper(fd, size)
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        _HEADER.pack_into(buf, 0, MAGIC, LAYOUT_VERSION, HEADER_SIZE, size)
        buf[_SESSION_OFFSET:_SESSION_OFFSET + _SESSION_LEN] = session_id.encode().ljust(_SESSION_LEN)
        return cls(name, buf, arrays)

    def unlink(self) -> None:
        """Remove the name; the memory goes once every mapping of it is gone."""
        if self.path is None:  # private memory (Segment.private): no name
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    # ---- client side ---------------------------------------------------------------
    @classmethod
    def attach(cls, name: str, session_id: str, arrays: dict[str, list], size: int,
               where: str) -> Segment:
        """Map the daemon's segment; SharedMemoryError (naming ``where``, the
        daemon) when this process cannot see it, UntrustedSegmentError when
        it belongs to another user (not root) or others may write it."""
        if "/" in name or not name.startswith(NAME_PREFIX):
            raise SharedMemoryError(f"the daemon sent an invalid segment name {name!r}")
        path = os.path.join(SHM_DIR, name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise SharedMemoryError(
                f"cannot attach the session's shared memory {path}: no such segment here. "
                f"{where} runs on another host or in another IPC namespace (container); "
                "shared-memory sessions need the daemon on this host, sharing /dev/shm") from None
        except PermissionError:
            raise SharedMemoryError(
                f"cannot attach the session's shared memory {path}: permission denied; "
                f"{where} runs as another user (segments are mode 0600)") from None
        try:
            info = os.fstat(fd)  # of the file opened: no race with a rename
            why = untrusted_reason(info, is_dir=False)
            if why is not None:
                raise UntrustedSegmentError(
                    f"refusing to map the session's shared memory {path}: {why}. Segments "
                    f"carry your observations and actions: {where} must run as your user "
                    "(or root) and nothing else may write them; check the owner and mode "
                    f"with `ls -l {path}` and who runs the daemon")
            if info.st_size < size:
                raise SharedMemoryError(f"{path} is smaller than the daemon announced")
            buf = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        _check_layout(arrays, size)
        magic, version, _, _ = _HEADER.unpack_from(buf, 0)
        found = bytes(buf[_SESSION_OFFSET:_SESSION_OFFSET + _SESSION_LEN]).decode(errors="replace")
        if magic != MAGIC or version != LAYOUT_VERSION or found.strip() != session_id:
            raise SharedMemoryError(
                f"{path} is not the segment of session {session_id} (layout {version}); "
                f"{where} and this process see different /dev/shm")
        return cls(name, buf, arrays)

    @classmethod
    def private(cls, name: str, arrays: dict[str, list], size: int) -> Segment:
        """Private memory laid out like the daemon's segment ``name``: the
        buffers of a session this process cannot map (the inline transport
        copies the arrays between them and the messages)."""
        _check_layout(arrays, size)
        segment = cls(name, mmap.mmap(-1, size), arrays)
        segment.path = None  # nothing under /dev/shm is ours
        return segment

    # ---- sequence counters ------------------------------------------------------------
    @property
    def step_seq(self) -> int:
        return int(self._counters[0])

    @property
    def done_seq(self) -> int:
        return int(self._counters[1])

    def bump_step_seq(self) -> None:
        self._counters[0] += 1

    def bump_done_seq(self) -> None:
        self._counters[1] += 1

    @property
    def memory(self) -> Any:
        """The whole mapping (header page and arrays): an mmap, or the
        daemon's guarded buffer."""
        return self._mmap

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "size": self.size}
