"""The shared-memory segment of a hosted session (Python envs in worker
processes, see native/src/backend_workers.h for the protocol).

One memfd holds everything the parent and the workers share, each array
cache-line aligned, in this order:

    ctl            one envd_worker_ctl_t per worker (at least one: the inline
                   mode's error messages go in ctl[0])
    worker_state   int32 per worker: STARTING, READY or FAILED (startup only)
    kind, req, ack, status, seeds, seed_pending
                   the per-env request words (backend_workers.h)
    checked_actions
                   the parent's checked copy of the actions the workers act on
    observations, actions, rewards, ... (envd.buffer_layout)
                   the session's batch buffers: the VecEnv returns views of them
                   (one per observation leaf; float64 rewards; the info slots)

A memfd has no name, so no segment can be left behind under /dev/shm; the
memory goes when the last mapping and descriptor of it go.  The parent maps
it and passes the descriptor to each worker (SCM_RIGHTS, at spawn only).
"""
from __future__ import annotations

import mmap
import os
from typing import Any

import numpy as np

from envd.native._envd_native import ffi

_ALIGN = 64

WORKER_STARTING, WORKER_READY, WORKER_FAILED = 0, 1, 2

#: (name, dtype) of the per-env request words, each (num_envs,)
_ENV_WORDS = (("kind", np.uint8), ("req", np.uint32), ("ack", np.uint32), ("status", np.int32),
              ("seeds", np.uint64), ("seed_pending", np.uint8))

Layout = dict[str, tuple[int, tuple[int, ...], str]]  # name -> (offset, shape, dtype str)


def segment_layout(num_envs: int, num_workers: int,
                   buffers: dict[str, tuple[tuple[int, ...], np.dtype]]) -> tuple[Layout, int]:
    """(layout, size in bytes) of the segment of num_envs envs on num_workers
    workers with these batch buffers (name -> (shape, dtype)); the checked
    actions are rows as the "actions" buffer's (envd.leaves.action_row)."""
    entries: list[tuple[str, tuple[int, ...], np.dtype]] = [
        ("ctl", (max(1, num_workers) * ffi.sizeof("envd_worker_ctl_t"),), np.dtype(np.uint8)),
        ("worker_state", (max(1, num_workers),), np.dtype(np.int32)),
        *((name, (num_envs,), np.dtype(dtype)) for name, dtype in _ENV_WORDS),
        ("checked_actions", *buffers["actions"]),
        *((name, tuple(shape), np.dtype(dtype)) for name, (shape, dtype) in buffers.items()),
        # a multi-agent env's (one with agent_mask): per row, absent from
        # its env's last reset (backend_workers.h's absent)
        *((("absent", tuple(buffers["agent_mask"][0]), np.dtype(np.uint8)),)
          if "agent_mask" in buffers else ()),
    ]
    layout: Layout = {}
    offset = 0
    for name, shape, dtype in entries:
        offset = -(-offset // _ALIGN) * _ALIGN
        layout[name] = (offset, shape, dtype.str)
        offset += int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return layout, max(_ALIGN, -(-offset // mmap.PAGESIZE) * mmap.PAGESIZE)


class Segment:
    """A mapping of a hosted session's segment: numpy views of every array
    (``arrays``) and the workers' control blocks (``ctl(w)``).  The mapping
    lives as long as any view of it (views a VecEnv returned stay valid, and
    the env's own, until it is garbage)."""

    def __init__(self, fd: int, layout: Layout, size: int):
        self.layout, self.size = layout, size
        self._map: mmap.mmap | None = mmap.mmap(fd, size, mmap.MAP_SHARED,
                                                mmap.PROT_READ | mmap.PROT_WRITE)
        self._base = ffi.from_buffer(self._map)
        self.arrays: dict[str, np.ndarray] = {
            name: np.ndarray(shape, np.dtype(dtype), self._map, offset)
            for name, (offset, shape, dtype) in layout.items()}

    @classmethod
    def create(cls, layout: Layout, size: int) -> tuple[Segment, int]:
        """A new zeroed segment and its memfd (close-on-exec; the caller
        closes it once the workers have theirs)."""
        fd = os.memfd_create("envd-hosted", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            return cls(fd, layout, size), fd
        except BaseException:
            os.close(fd)
            raise

    def ctl(self, worker: int) -> Any:
        """Worker's control block (an envd_worker_ctl_t * into the mapping)."""
        return ffi.cast("envd_worker_ctl_t *",
                        self._base + self.layout["ctl"][0]) + worker

    def message(self, worker: int) -> tuple[int, str]:
        """(env index, "ExcType: message") the worker last wrote (-1: none)."""
        ctl = self.ctl(worker)
        return int(ctl.error_env), ffi.string(ctl.message).decode("utf-8", "replace")

    def write_message(self, worker: int, env_index: int, text: str) -> None:
        ctl = self.ctl(worker)
        data = text.encode("utf-8", "replace")[:len(ctl.message) - 1]
        ffi.memmove(ctl.message, data + b"\0", len(data) + 1)
        ctl.error_env = env_index

    def close(self) -> None:
        """Drop this object's hold on the mapping.  The mapping itself (and the
        descriptor Python's mmap keeps) goes with the last numpy view of it:
        numpy arrays keep the mmap object as their base without holding its
        buffer, so unmapping it now would leave the caller's views dangling."""
        self.arrays = {}
        if self._base is not None:
            ffi.release(self._base)
            self._base = None
        self._map = None
