"""The in-process VecEnv's send-id check and recv gather in one native call
each (native/src/batch_rows.h): the hooks BatchedVecEnv._checked_ids and
._row_copier, which do the same with a handful of numpy calls (the
daemon-served env, whose client loads no native code, keeps those).

For a cheap env those numpy calls were most of an async batch's cost on the
trainer's thread (docs/benchmarks.md, "Async batches"); results are the same
either way (tests/native/test_batch_rows.py compares them).
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from envd.native._envd_native import ffi, lib


class IdChecker:
    """Checks the env ids of sends to num_envs envs (see check)."""

    def __init__(self, num_envs: int):
        self.num_envs = num_envs
        self._stamp = np.zeros(num_envs, np.int64)  # env -> the last check that saw it
        self._generation = 0
        self._bad = ffi.new("int64_t *")

    def check(self, ids: np.ndarray) -> np.ndarray | None:
        """ids (1-D, integer dtype, non-empty) as a new int64 array when each
        is in [0, num_envs) and none repeats; None otherwise (the caller
        raises its own error) or for ids the native check does not read (a
        byte order not the machine's)."""
        if not ids.dtype.isnative:
            return None
        if not ids.flags.c_contiguous:
            ids = np.ascontiguousarray(ids)
        out = np.empty(len(ids), np.int64)
        self._generation += 1  # (never reused: an int64 counter of checks)
        rc = lib.envd_batch_ids(ffi.from_buffer(ids), ids.dtype.itemsize,
                                ids.dtype.kind == "i", len(ids), self.num_envs,
                                ffi.from_buffer("int64_t[]", out),
                                ffi.from_buffer("int64_t[]", self._stamp), self._generation,
                                self._bad)
        return out if rc == lib.ENVD_OK else None


def row_copier(pairs: list[tuple[np.ndarray, np.ndarray]]
               ) -> Callable[[np.ndarray, slice | None], None] | None:
    """A function of (rows, run) (rows: int64, each in range) that copies
    those rows of every (buffer, slot) pair's buffer into its slot in one
    native call, or None if some array is not C-contiguous (the caller copies
    with numpy).  run (the rows as a slice, or None: BatchedVecEnv._row_copier)
    is not used: one native call costs less than a slice copy per buffer.

    Rows the native copy cannot take as they are (not one C-contiguous,
    aligned int64 row per slot row) are copied with numpy's take, which
    raises as the numpy path does for a count that is not the slots' (the
    native copy would write past the slots)."""
    if not all(a.flags.c_contiguous for pair in pairs for a in pair):
        return None
    if not pairs:
        def copy_nothing(rows: np.ndarray, run: slice | None = None) -> None:
            pass
        return copy_nothing
    # The arrays outlive the copier (the env owns both); the closure keeps them.
    src = ffi.new("void *[]", [ffi.from_buffer(b) for b, _ in pairs])
    dst = ffi.new("void *[]", [ffi.from_buffer(s) for _, s in pairs])
    row_bytes = ffi.new("uint64_t[]", [b.nbytes // len(b) for b, _ in pairs])
    count = len(pairs)
    slot_rows = min(len(s) for _, s in pairs)
    gather = lib.envd_batch_gather
    int64 = np.dtype(np.int64)

    def copy(rows: np.ndarray, run: slice | None = None) -> None:
        # (a few attribute reads: the native call reads rows as int64_t[])
        flags = rows.flags
        if (rows.dtype != int64 or rows.ndim != 1 or len(rows) != slot_rows
                or not (flags.c_contiguous and flags.aligned)):
            for buffer, slot in pairs:
                buffer.take(rows, axis=0, out=slot, mode="clip")
            return
        gather(ffi.from_buffer("int64_t[]", rows), slot_rows, count, src, dst, row_bytes)

    copy.arrays = pairs  # type: ignore[attr-defined]  # their memory, while src/dst point at it
    return copy
