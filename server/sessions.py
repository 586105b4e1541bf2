"""Sessions (one make: a native vec over one shared-memory segment) and the
clients that hold them under a lease.

Ownership: the daemon's event loop thread owns every Session and ClientRecord.
A session runs one operation at a time (``busy``); while it is busy only the
thread running the operation (a pool worker, or an executor thread for make
and reset) touches the native vec, and the loop touches nothing but the flags.
"""
from __future__ import annotations

import os
import secrets
import stat
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode

from envd import protocol
from envd.errors import EnvdError, EnvStateError, InvalidActionError
from envd.native import segment_guard
from envd.native._envd_native import lib
from envd.native.native_session import NativeSession
from envd.native.native_vec import NativePool
from envd.native.registry import EnvSpec
from envd.native.vector_env import AUTORESET_MODE_CODES
from envd.shm import HEADER_SIZE, Segment, plan
from envd.vector_base import autoreset_mode_name, buffer_layout


#: Offset of the doorbell's ``closed`` word in it (native/src/fast.h).
_DOORBELL_CLOSED = 88


def segment_plan(spec: EnvSpec, num_envs: int, mode: AutoresetMode) -> tuple[dict[str, list], int]:
    """Where a session's arrays lie in its segment, and the segment's size in
    bytes: what Session creates, asked before creating it (--max-shm-bytes)."""
    layout = buffer_layout(spec.observation_space, spec.action_space, num_envs, mode,
                           spec.info_fields)
    layout["doorbell_ids"] = ((num_envs,), np.dtype(np.int64))  # protocol.DOORBELL_ARRAYS
    return plan(layout)


def state_plan(spec: EnvSpec, num_envs: int) -> int:
    """The most heap bytes a session of num_envs envs of spec holds (what
    --max-state-bytes counts, asked before the make allocates anything): the
    native vec (env states and slots, the private copies of its inputs; see
    envd_vec_memory_bytes) and the native session's async books at their
    bound (envd_session_books_max_bytes), which every path shares; plus the
    socket path's ready ids here (at most num_envs, in arrays)."""
    n = num_envs
    return (int(lib.envd_vec_memory_bytes(spec.definition, n))
            + int(lib.envd_session_books_max_bytes(n)) + 2 * n * 8)


class _SocketBatches:
    """The socket path's view of the native session's books, in the shape
    the Service uses (transitional: the daemon's own ready list goes away
    when its stepping handlers call NativeSession directly).  Every finished
    env of a socket send is moved to the Session's ready list by collect;
    in_flight marks the envs of socket sends not collected yet (inline sends
    must not write their action rows; envs sent through the doorbell are the
    doorbell's)."""

    def __init__(self, native: NativeSession):
        self.native = native
        self.in_flight = np.zeros(native.num_envs, np.bool_)
        self.count = 0

    def __bool__(self) -> bool:
        return self.count > 0

    def num_envs(self) -> int:
        return self.count

    def submit(self, env_ids: np.ndarray, notify: bool) -> None:
        self.native.send(env_ids, notify)
        self.in_flight[env_ids] = True
        self.count += len(env_ids)

    def collect(self) -> tuple[list[np.ndarray], EnvdError | None]:
        if not self.count:
            return [], None
        ready = self.native.counts()[1]
        if not ready:
            return [], None
        error = None
        try:
            ids = self.native.try_recv(ready)
        except EnvdError as exc:  # a failed env: its batch stays ready, taken now
            error = exc
            ids = self.native.try_recv(ready)
        self.in_flight[ids] = False
        self.count -= len(ids)
        return [ids], error


def async_in_flight(call: str) -> EnvStateError:
    """The refusal of a whole-vec call while async envs are out."""
    return EnvStateError(f"{call} while envs sent with send are in flight or not received "
                         "yet; recv them first")


class Session:
    """num_envs envs of one spec whose buffers live in a shared-memory segment."""

    def __init__(self, owner: bytes, spec: EnvSpec, num_envs: int, mode: AutoresetMode,
                 max_episode_steps: int, params: list[float], seeds: np.ndarray,
                 pool: NativePool, segment_prefix: str):
        self.id = secrets.token_hex(16)
        self.owner = owner
        self.spec = spec
        self.num_envs = num_envs
        self.mode = mode
        self.max_episode_steps = max_episode_steps
        self.busy = False      # a reset, step or recv is running (or waiting)
        self.closing = False   # free as soon as the running operation ends
        self.steps = 0         # sync step calls
        self.env_steps = 0     # env steps, sync and async (for status)
        self.created = time.monotonic()
        # Async mode: the ids of finished envs not reported yet (in the order
        # they were found finished), and a recv waiting for enough of them:
        # (identity, request id, count, inline).  The batches live in self.batches.
        self.batch_size = num_envs
        self.render_mode: str | None = None  # make's render_mode, checked against the spec
        self.ready: list[np.ndarray] = []
        self.num_ready = 0
        self.recv_waiter: tuple[bytes, int, int, bool] | None = None  # (..., inline)
        # The first failure of an env in a finished batch, reported by the next
        # recv (its envs are in self.ready, so the recv after it returns them).
        self.batch_error: EnvdError | None = None
        # The fast path's server thread, once the client asked for it; its
        # steps are counted by the thread (fast_counted: (steps, batch envs)
        # folded in so far).
        self.fast: _Doorbell | None = None
        self.fast_counted = (0, 0)
        arrays, size = segment_plan(spec, num_envs, mode)
        self.segment_bytes = size  # what --max-shm-bytes counts
        self.state_bytes = state_plan(spec, num_envs)  # what --max-state-bytes counts
        self.segment = Segment.create(segment_prefix + self.id, self.id, arrays, size,
                                      mapper=segment_guard.map_segment)
        self._arrays = arrays
        try:
            self.buffers = self.segment.arrays
            self.buffers["reset_seeds"][...] = seeds
            self.native = NativeSession(spec, num_envs,
                                        autoreset_mode=AUTORESET_MODE_CODES[mode],
                                        max_episode_steps=max_episode_steps, params=params,
                                        buffers=self.buffers, pool=pool)
            self.native.seed()
            self.batches = _SocketBatches(self.native)
        except BaseException:
            self.segment.unlink()
            raise

    @property
    def revoked(self) -> bool:
        """The client truncated this session's segment: the daemon's mapping
        is private zero pages now (envd.native.segment_guard), the client
        sees none of its results, and the session must be closed."""
        return segment_guard.revoked(self.segment.memory)

    def mark_doorbell_closed(self) -> None:
        """Tell a fast-path client waiting on its doorbell that the session is
        closed, through its own mapping: set ``closed`` in the header page of
        the segment's file (if the truncation left that page), so that it
        stops waiting and asks over the socket, which says why.  Mapped
        through the guard too: the client may truncate it again meanwhile."""
        try:  # the name may be anything of the client's by now: no symlink, no wait
            fd = os.open(self.segment.path,
                         os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size < HEADER_SIZE:
                return
            page = segment_guard.map_segment(fd, HEADER_SIZE)
        except (OSError, EnvdError):  # (the guard's table full: the client times out)
            return
        finally:
            os.close(fd)
        closed = np.frombuffer(page, np.uint32, 1, protocol.DOORBELL_OFFSET + _DOORBELL_CLOSED)
        closed[0] = 1

    def describe(self) -> dict[str, Any]:
        """The make reply: where the arrays are and what the env looks like."""
        return {"session": self.id, "env_id": self.spec.id,
                "shm": {**self.segment.describe(), "arrays": self._arrays},
                "observation_space": protocol.space_to_wire(self.spec.observation_space),
                "action_space": protocol.space_to_wire(self.spec.action_space),
                "max_episode_steps": self.max_episode_steps or None,
                "batch_size": self.batch_size,
                "autoreset_mode": autoreset_mode_name(self.mode),
                "render_mode": self.render_mode,
                "render_fps": self.spec.render_fps if self.render_mode else None}

    def write_actions(self, description: dict[str, Any], blob: bytes) -> None:
        """Copy inline actions (a data frame) into the actions buffer; they must
        have exactly the buffer's dtype and shape."""
        actions = self.buffers["actions"]
        dtype, shape = description.get("dtype"), description.get("shape")
        if dtype != actions.dtype.str or shape != list(actions.shape) or set(description) != {"dtype", "shape"}:
            raise InvalidActionError(
                f"{self.spec.id}: inline actions must be described as "
                f"{{dtype: {actions.dtype.str!r}, shape: {list(actions.shape)}}}, got {description!r}")
        if len(blob) != actions.nbytes:
            raise InvalidActionError(
                f"{self.spec.id}: the actions frame must hold {actions.nbytes} bytes "
                f"({actions.dtype} x {actions.shape}), got {len(blob)}")
        actions[...] = np.frombuffer(blob, actions.dtype).reshape(actions.shape)

    def read_input(self, name: str, blob: bytes) -> None:
        """Copy a whole input array sent inline (reset's seeds or mask) into
        its buffer: exactly the buffer's size in bytes."""
        target = self.buffers[name]
        if len(blob) != target.nbytes:
            raise protocol.BadRequest(
                f"inline {name} must be {target.nbytes} bytes ({target.dtype} x "
                f"{target.shape}), got {len(blob)}")
        target[...] = np.frombuffer(blob, target.dtype).reshape(target.shape)

    def write_action_rows(self, env_ids: np.ndarray, blob: bytes) -> None:
        """Copy the actions of an inline send into the rows of env_ids.  Rows
        of envs still on the pool are never written (a worker reads them):
        with such an id, or one out of range, nothing is written and submit
        refuses the send with its usual error."""
        actions = self.buffers["actions"]
        row_bytes = actions[0].nbytes if self.num_envs else 0
        if len(blob) != len(env_ids) * row_bytes:
            raise InvalidActionError(
                f"{self.spec.id}: an inline send of {len(env_ids)} envs needs "
                f"{len(env_ids) * row_bytes} bytes of actions ({actions.dtype} x "
                f"{actions.shape[1:]} per env), got {len(blob)}")
        if env_ids.min() < 0 or env_ids.max() >= self.num_envs:
            return
        if self.batches.in_flight[env_ids].any():
            return
        actions[env_ids] = np.frombuffer(blob, actions.dtype).reshape(-1, *actions.shape[1:])

    def outputs(self, rows: np.ndarray | None = None) -> dict[str, Any]:
        """The inline reply's fields: the output arrays' names and, as blobs,
        the whole arrays (rows None: views, copied once into the message when
        it is sent) or the given rows of each."""
        names = protocol.output_arrays(self.buffers)
        if rows is None:
            blobs = [memoryview(self.buffers[name]).cast("B") for name in names]
        else:
            blobs = [np.take(self.buffers[name], rows, axis=0) for name in names]
        return {"arrays": names, "_blobs": blobs}

    def submit(self, env_ids: np.ndarray) -> int:
        """Start stepping env_ids (async send); a batch run inline is ready at
        once.  Returns how many envs became ready (see collect)."""
        self.batches.submit(env_ids, notify=True)
        return self.collect()

    def collect(self) -> int:
        """Move the envs of finished batches to the ready list; how many.  An
        env's failure never loses an id: the envs go to the ready list all the
        same and the failure waits in batch_error for the next recv."""
        finished, error = self.batches.collect()
        self.ready.extend(finished)
        count = sum(map(len, finished))
        self.num_ready += count
        self.env_steps += count
        self.batch_error = self.batch_error or error
        return count

    def take_batch_error(self) -> EnvdError | None:
        error, self.batch_error = self.batch_error, None
        return error

    def take_ready(self) -> np.ndarray:
        ids = np.concatenate(self.ready) if self.ready else np.empty(0, np.int64)
        self.ready, self.num_ready = [], 0
        return ids

    def start_fast(self, spin_ns: int) -> None:
        """Serve this session's steps, sends and recvs from the doorbell in its
        header page."""
        self.native.start_doorbell(self.segment.memory, self.buffers["doorbell_ids"], spin_ns)
        self.fast = _Doorbell(self.native)
        self.fast_counted = self.native.served()  # (the session counts every path)

    def new_fast_steps(self) -> tuple[int, int]:
        """(steps, env steps) the fast path served since the last call."""
        if self.fast is None:
            return 0, 0
        served = self.native.served()
        steps, batch_envs = (now - before for now, before in zip(served, self.fast_counted))
        self.fast_counted = served
        return steps, steps * self.num_envs + batch_envs

    def job_stats(self) -> dict[str, float]:
        """The vec's dispatch statistics; while the fast path's thread steps
        the vec (reading them then would race it), those read last time: they
        lag, they never go back."""
        if self.fast is None:
            return self.native.stats()
        if self.fast.try_lock():
            try:
                self._last_stats = self.native.stats()
            finally:
                self.fast.unlock()
        return getattr(self, "_last_stats", {"inline_jobs": 0, "pooled_jobs": 0})

    def reset(self, with_seeds: bool, with_mask: bool) -> None:
        """Reset on the executor; a fast-path request rung meanwhile waits."""
        fast = self.fast  # the Service stops it only once this operation has ended
        if fast is None:
            self.native.reset(with_seeds, with_mask)
            return
        fast.lock()
        try:
            self.check_no_fast_async("reset")
            self.native.reset(with_seeds, with_mask)
        finally:
            fast.unlock()

    def render(self) -> np.ndarray:
        """Every env's frame, (num_envs, height, width, 3) uint8, drawn on the
        executor into private memory (a render request's reply carries it); a
        fast-path request rung meanwhile waits."""
        frames = np.empty((self.num_envs,) + self.spec.render_shape, np.uint8)
        fast = self.fast  # the Service stops it only once this operation has ended
        if fast is None:
            self.native.render(frames)
            return frames
        fast.lock()
        try:
            self.check_no_fast_async("render")
            self.native.render(frames)
        finally:
            fast.unlock()
        return frames

    def check_no_fast_async(self, call: str) -> None:
        """Refuse call while envs sent through the doorbell are in flight or
        not received (the client's books would no longer match the daemon's).
        Holding the fast path's lock."""
        if self.fast.pending():
            raise async_in_flight(call)

    def free(self) -> None:
        """Destroy the envs and remove the segment.  Only when not busy and no
        batch is in flight (or at shutdown: then this waits for them)."""
        if self.fast is not None:  # first: it steps the vec (after its request)
            self.fast.stop()  # (the Service stopped it already, counting its steps)
        native = getattr(self, "native", None)
        if native is not None:
            native.close()  # waits for batches in flight
        self.native = None
        self.buffers = None
        self.segment.unlink()


class _Doorbell:
    """The doorbell of a Session's native session, in the shape the Service
    uses (transitional, as _SocketBatches)."""

    def __init__(self, native: NativeSession):
        self.native = native

    def lock(self) -> None:
        self.native.lock()

    def try_lock(self) -> bool:
        return self.native.try_lock()

    def unlock(self) -> None:
        self.native.unlock()

    def pending(self) -> int:
        """Envs sent through the doorbell and not received yet."""
        return sum(self.native.counts())

    def drain(self) -> None:
        self.native.drain()

    def stop(self) -> None:
        self.native.stop_doorbell()


@dataclass
class ClientRecord:
    """A client connection (its ZeroMQ routing id) and the sessions it leases."""

    identity: bytes
    name: str = ""
    last_seen: float = field(default_factory=time.monotonic)
    sessions: dict[str, Session] = field(default_factory=dict)
    reserved_envs: int = 0  # envs of makes still running
    reserved_sessions: int = 0  # makes still running
    # --max-requests-per-second: a token bucket, full (capped at the burst on
    # first use) when the client arrives; refilled on each request.
    tokens: float = float("inf")
    refilled: float = field(default_factory=time.monotonic)

    @property
    def num_envs(self) -> int:
        return sum(s.num_envs for s in self.sessions.values())

    def touch(self) -> None:
        self.last_seen = time.monotonic()

    def take_token(self, rate: int, burst: int) -> bool:
        """One request's token; False (nothing taken) when the bucket is empty.
        Called right after touch(): last_seen is now."""
        now = self.last_seen
        tokens = self.tokens + (now - self.refilled) * rate
        self.refilled = now
        if tokens > burst:
            tokens = burst
        if tokens < 1.0:
            self.tokens = tokens
            return False
        self.tokens = tokens - 1.0
        return True

    def token_wait(self, rate: int) -> float:
        """Seconds until the bucket holds the next request's token."""
        return max(0.0, 1.0 - self.tokens) / rate
