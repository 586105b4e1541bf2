"""Sessions (one make: a native vec over one shared-memory segment) and the
clients that hold them under a lease.

Ownership: the daemon's event loop thread owns every Session and ClientRecord.
A session runs one operation at a time (its lifecycle, server/lifecycle.py,
is BUSY meanwhile); while it is busy only the thread running the operation (a
pool worker, or an executor thread for make, reset and render) touches the
native vec, and the loop touches nothing but the lifecycle.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from gymnasium.vector import AutoresetMode

from envd import protocol
from envd.autoreset import autoreset_mode_name
from envd.buffer_layout import buffer_layout
from envd.errors import EnvdError, EnvStateError, InvalidActionError
from envd.native import segment_guard
from envd.native._envd_native import lib
from envd.native.native_session import NativeSession
from envd.native.native_vec import NativePool
from envd.native.registry import EnvSpec
from envd.native.vector_env import AUTORESET_MODE_CODES
from envd.server.lifecycle import Lifecycle
from envd.shm import HEADER_SIZE, Segment, plan

if TYPE_CHECKING:
    from envd.server.hosted import HostedEnvSpec

#: Offset of the doorbell's ``closed`` word in it (native/src/doorbell.h).
_DOORBELL_CLOSED = 88


class SessionBackend(Protocol):
    """What a session steps its envs through: a NativeSession (built-in and
    plugin envs), or a hosted session's HostedNative (server/hosted.py)."""

    def counts(self) -> tuple[int, int]: ...
    def served(self) -> tuple[int, int]: ...
    def stats(self) -> dict[str, float]: ...
    def try_lock(self) -> bool: ...
    def unlock(self) -> None: ...
    def reset(self, with_seeds: bool, with_mask: bool) -> None: ...
    def async_reset(self, with_seeds: bool) -> None: ...
    @property
    def handle(self) -> Any: ...  # the native session (the daemon's request engine steps it)
    def step_result(self, result: int, index: int | None = None) -> int: ...
    def recv_error(self, rc: int, count: int, index: int | None = None) -> BaseException: ...
    def send_error(self, rc: int, index: int | None = None) -> BaseException: ...
    def start_doorbell(self, segment: Any, ids: np.ndarray, spin_ns: int) -> None: ...
    def stop_doorbell(self) -> None: ...
    def drain(self) -> None: ...
    def render(self, out: np.ndarray, /) -> None: ...
    def close(self) -> None: ...


def segment_plan(spec: EnvSpec, num_envs: int, mode: AutoresetMode) -> tuple[dict[str, list], int]:
    """Where a session's arrays lie in its segment, and the segment's size in
    bytes: what Session creates, asked before creating it (--max-shm-bytes)."""
    # a multi-agent env's agents are rows (envd.h): every array has
    # num_envs * num_agents of them; the doorbell's ids name envs
    agents = getattr(spec, "num_agents", 1)  # (hosted specs have none)
    layout = buffer_layout(spec.observation_space, spec.action_space, num_envs * agents, mode,
                           spec.info_fields, num_agents=agents,
                           episode_fields=getattr(spec, "episode_fields", ()))
    layout["doorbell_ids"] = ((num_envs,), np.dtype(np.int64))  # protocol.DOORBELL_ARRAYS
    return plan(layout)


def state_plan(spec: EnvSpec, num_envs: int) -> int:
    """The most heap bytes a session of num_envs envs of spec holds (what
    --max-state-bytes counts, asked before the make allocates anything): the
    native vec (env states and slots, the private copies of its inputs; see
    envd_vec_memory_bytes) and the native session's async books at their
    bound (envd_session_books_max_bytes), which every path shares (the
    daemon keeps no books of its own), and with ABI 5 describe the spaces'
    arrays and every env's own heap (heap_bytes: what its init, reset and
    step allocate outside the state block, e.g. an Ocean env's grid)."""
    n = num_envs
    return (int(lib.envd_vec_memory_bytes(spec.definition, n))
            + int(lib.envd_session_books_max_bytes(n))
            + getattr(spec, "described_bytes", 0)
            + n * getattr(spec, "heap_bytes", 0))


#: The longest an operation on the executor (reset, async reset, render)
#: waits for the session's lock, which the doorbell's thread holds while it
#: serves a request: a hosted env's step has no bound (it may hang), and two
#: executor threads blocked on such locks would stop every make, reset and
#: render of the daemon.  After this it is refused (session_busy).
EXECUTOR_LOCK_WAIT_SECONDS = 1.0


def session_busy(session_id: str, call: str) -> EnvStateError:
    """The refusal of a call that needs the session's lock while the
    doorbell's thread holds it (it serves a step, send or recv)."""
    return EnvStateError(f"{call} on session {session_id}: its fast path is serving a request "
                         "(a step, send or recv rung at its doorbell) that has not returned; "
                         "retry once it returns (a hung env's: close the session)")


def async_in_flight(call: str) -> EnvStateError:
    """The refusal of a whole-vec call while async envs are out."""
    return EnvStateError(f"{call} while envs sent with send are in flight or not received "
                         "yet; recv them first")


class Session:
    """num_envs envs of one spec whose buffers live in a shared-memory segment,
    stepped by one NativeSession (which keeps the async books: env states,
    ready ids, a failed batch's error) for the socket path and the doorbell.
    A multi-agent env's agents are rows: every array of the segment has
    num_envs * num_agents rows (agent-major), while env ids (send, recv, the
    doorbell's ids) name envs."""

    #: agents per env (rows of each env in the arrays); 1 unless the spec says more
    num_agents = 1

    @property
    def agents_per_env(self) -> int:
        """Agents per env, each a row (for status): a C multi-agent env's, or
        a hosted PettingZoo env's (server/hosted.py)."""
        return self.num_agents

    def __init__(self, owner: bytes, spec: EnvSpec, num_envs: int, mode: AutoresetMode,
                 max_episode_steps: int, params: list[float], seeds: np.ndarray,
                 pool: NativePool | None, segment_prefix: str,
                 on_free: Callable[[Session, bool], None] | None = None,
                 max_threads: int | None = None):
        """on_free(session, orderly): what the daemon does when the session's
        lifecycle frees it (its own books), before the envs are destroyed.
        max_threads: make's cap on the pool threads stepping these envs at
        once (None: none; 0: inline on the thread serving each call)."""
        self.id = secrets.token_hex(16)
        self.owner = owner
        self.spec: EnvSpec | HostedEnvSpec = spec  # (a HostedServerSession's: hosted)
        self.num_envs = num_envs  # envs; each is num_agents rows of the arrays
        self.num_agents = spec.num_agents
        self.mode = mode
        self.max_episode_steps = max_episode_steps
        self.steps = 0         # whole steps, by every path (for status)
        self.env_steps = 0     # env steps, sync and async, by every path (for status)
        self.created = time.monotonic()
        self.batch_size = num_envs
        self.max_threads = max_threads
        self.render_mode: str | None = None  # make's render_mode, checked against the spec
        # Whether the session's doorbell is served (the fast path); what the
        # session had served when its steps were last counted.
        self.fast_path = False
        self._counted = (0, 0)
        self._last_stats: dict[str, float] = {"inline_jobs": 0, "pooled_jobs": 0}
        arrays, size = segment_plan(spec, num_envs, mode)
        self.segment_bytes = size  # what --max-shm-bytes counts
        self.state_bytes = state_plan(spec, num_envs)  # what --max-state-bytes counts
        self.segment = Segment.create(segment_prefix + self.id, self.id, arrays, size,
                                      mapper=segment_guard.map_segment)
        self._arrays = arrays
        try:
            self.buffers = self.segment.arrays
            self.buffers["reset_seeds"][:num_envs] = seeds  # (one per env, not per row)
            self._native: SessionBackend | None = NativeSession(
                spec, num_envs, autoreset_mode=AUTORESET_MODE_CODES[mode],
                max_episode_steps=max_episode_steps, params=params, buffers=self.buffers,
                pool=pool, max_threads=max_threads, seeded=True)
        except BaseException:
            self.segment.unlink()
            raise
        self.life = Lifecycle(self.id, free=self._freed_by_lifecycle,
                              outstanding=self.batches_in_flight)
        self._on_free = on_free

    @property
    def native(self) -> SessionBackend:
        """What steps the envs; RuntimeError once the session was freed (a
        bug: every path checks the session's lifecycle first)."""
        native = self._native
        if native is None:
            raise RuntimeError(f"session {self.id} ({self.spec.id}) was freed: its envs are gone")
        return native

    @property
    def native_if_alive(self) -> SessionBackend | None:
        """What steps the envs, None once the session was freed."""
        return self._native

    def in_flight_or_held(self) -> bool:
        """Envs are in flight, or another thread holds the session's lock (an
        operation on the executor, a doorbell serving a request: busy all the
        same).  Never waits for the lock; False once the session was freed."""
        native = self._native
        if native is None:
            return False
        if not native.try_lock():
            return True
        try:
            return native.counts()[0] > 0
        finally:
            native.unlock()

    def frame_shape(self) -> tuple[int, ...]:
        """(height, width, 3) of the env's frames; EnvStateError for an env
        that does not render (make refuses render_mode for it first)."""
        shape = self.spec.render_shape
        if shape is None:
            raise EnvStateError(f"session {self.id} ({self.spec.id}): the env does not render")
        return tuple(shape)

    def _freed_by_lifecycle(self, orderly: bool) -> None:
        if self._on_free is not None:
            self._on_free(self, orderly)
        self.free()

    def batches_in_flight(self) -> bool:
        """Envs sent over the socket are still on the pool (a closing session
        waits for them: freeing would block the event loop until they end).
        The doorbell's are not counted: its stop drops them."""
        return not self.fast_path and self.native.counts()[0] > 0

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
        path = self.segment.path
        if path is None:  # (never: the daemon made the segment under a name)
            return
        try:  # the name may be anything of the client's by now: no symlink, no wait
            fd = os.open(path,
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
        return {"session": self.id, "env_id": self.spec.id, "num_agents": self.num_agents,
                "possible_agents": list(getattr(self.spec, "agent_names", ())),
                "shm": {**self.segment.describe(), "arrays": self._arrays},
                "observation_space": protocol.space_to_wire(self.spec.observation_space),
                "action_space": protocol.space_to_wire(self.spec.action_space),
                "max_episode_steps": self.max_episode_steps or None,
                "batch_size": self.batch_size, "max_threads": self.max_threads,
                "autoreset_mode": autoreset_mode_name(self.mode),
                "render_mode": self.render_mode,
                # the env's frame rate whenever it can render (the client's
                # metadata["render_modes"] lists rgb_array then, rendering or not)
                "render_fps": self.spec.render_fps,
                # ABI 5 (absent: none, as from an older daemon)
                "resets_itself": getattr(self.spec, "resets_itself", False),
                "episode_fields": list(getattr(self.spec, "episode_fields", ()))}

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
        """Copy the actions of an inline send into the rows of env_ids.  With
        an id out of range nothing is written and send refuses it with its
        usual error.  A row of an env still in flight may be written: the vec
        stepping it reads its private copy, taken when the env was sent (the
        segment is client-writable anyway), and send refuses that env."""
        actions = self.buffers["actions"]
        row_bytes = actions[0].nbytes * self.num_agents
        if len(blob) != len(env_ids) * row_bytes:
            raise InvalidActionError(
                f"{self.spec.id}: an inline send of {len(env_ids)} envs needs "
                f"{len(env_ids) * row_bytes} bytes of actions ({actions.dtype} x "
                f"{actions.shape[1:]} per row, {self.num_agents} row(s) per env), "
                f"got {len(blob)}")
        if env_ids.min() < 0 or env_ids.max() >= self.num_envs:
            return
        actions[self.rows_of(env_ids)] = np.frombuffer(blob, actions.dtype).reshape(
            -1, *actions.shape[1:])

    def rows_of(self, env_ids: np.ndarray) -> np.ndarray:
        """The rows of envs env_ids in the arrays (a multi-agent env's agents,
        agent-major: env i is rows i*A .. i*A+A-1), in their order."""
        if self.num_agents == 1:
            return env_ids
        agents = self.num_agents
        return (env_ids[:, None] * agents + np.arange(agents)).ravel()

    def outputs(self, env_ids: np.ndarray | None = None) -> dict[str, Any]:
        """The inline reply's fields: the output arrays' names and, as blobs,
        the whole arrays (env_ids None: views, copied once into the message
        when it is sent) or the rows of the given envs (a multi-agent env's
        agents each, agent-major)."""
        names = protocol.output_arrays(self.buffers)
        if env_ids is None:
            blobs: list[memoryview | np.ndarray] = [self.buffers[name].data.cast("B")
                                                    for name in names]
        else:
            rows = self.rows_of(env_ids)
            blobs = [np.take(self.buffers[name], rows, axis=0) for name in names]
        return {"arrays": names, "_blobs": blobs}

    # ---- the fast path, counting, executor operations -------------------------------------
    def start_doorbell(self, spin_ns: int) -> None:
        """Serve this session's steps, sends and recvs from the doorbell in its
        header page."""
        self.native.start_doorbell(self.segment.memory, self.buffers["doorbell_ids"], spin_ns)
        self.fast_path = True

    def stop_doorbell(self, freeing: bool = False) -> None:
        """Stop serving the doorbell (after the request it serves: a native
        env's step always ends); the envs sent through it and not received
        are dropped.  freeing: the session is being freed (see the hosted
        session's override, whose requests may hang)."""
        self.native.stop_doorbell()
        self.fast_path = False

    @contextlib.contextmanager
    def locked(self, call: str, wait: float = 0.0):
        """Hold the session's lock for call, waiting at most wait seconds for
        it (polling: never blocked on it); EnvStateError (session_busy) if
        it is still held then: the doorbell serves a request.  The event
        loop passes 0, the executor EXECUTOR_LOCK_WAIT_SECONDS."""
        deadline = time.monotonic() + wait
        while not self.native.try_lock():
            if time.monotonic() >= deadline:
                raise session_busy(self.id, call)
            time.sleep(0.001)
        try:
            yield
        finally:
            self.native.unlock()

    def new_steps(self, collect: bool = False) -> tuple[int, int]:
        """(steps, env steps) the session served by every path (socket and
        doorbell) since the last call.  collect: count the async envs of
        batches that finished but nobody collected yet too (unless the
        session's lock is held now: the doorbell serves a request, or a reset
        runs; they are counted next time).  Never blocks."""
        if collect and self.native.try_lock():
            try:
                self.native.counts()  # collects finished batches
            finally:
                self.native.unlock()
        served = self.native.served()
        steps, batch_envs = (now - before for now, before in zip(served, self._counted))
        self._counted = served
        return steps, steps * self.num_envs + batch_envs

    def job_stats(self) -> dict[str, float]:
        """The vec's dispatch statistics; while the doorbell's thread steps
        the vec (reading them then would wait for it), those read last time:
        they lag, they never go back."""
        if self.native.try_lock():
            try:
                self._last_stats = self.native.stats()
            finally:
                self.native.unlock()
        return self._last_stats

    def reset(self, with_seeds: bool, with_mask: bool) -> None:
        """Reset on the executor (the session's lock holds the doorbell off;
        refused if the doorbell still serves a request after
        EXECUTOR_LOCK_WAIT_SECONDS)."""
        with self.locked("reset", EXECUTOR_LOCK_WAIT_SECONDS):
            self.native.reset(with_seeds, with_mask)

    def async_reset(self, with_seeds: bool) -> None:
        """Async reset on the executor: waits for the envs in flight (a
        native batch ends), as reset for the lock."""
        with self.locked("async reset", EXECUTOR_LOCK_WAIT_SECONDS):
            self.native.async_reset(with_seeds)

    def render(self, max_bytes: int) -> np.ndarray:
        """Every env's frame, (num_envs, height, width, 3) uint8, drawn on the
        executor into private memory (a render request's reply carries it).
        max_bytes: --max-message-bytes, which the caller checked the frames'
        size against already (HostedServerSession's are known once drawn)."""
        frames = np.empty((self.num_envs, *self.frame_shape()), np.uint8)
        with self.locked("render", EXECUTOR_LOCK_WAIT_SECONDS):
            self.native.render(frames)
        return frames

    def free(self) -> None:
        """Destroy the envs and remove the segment.  Only when not busy and no
        batch is in flight (or at shutdown: then this waits for them)."""
        native = getattr(self, "_native", None)
        if native is not None:
            native.close()  # stops the doorbell first, waits for what is in flight
        self._native = None
        self.buffers = {}  # (no view of the segment outlives it)
        self.segment.unlink()


@dataclass
class ClientRecord:
    """A client connection (its ZeroMQ routing id) and the sessions it leases."""

    identity: bytes
    name: str = ""
    last_seen: float = field(default_factory=time.monotonic)
    sessions: dict[str, Session] = field(default_factory=dict)
    reserved_envs: int = 0  # envs of makes still running
    reserved_sessions: int = 0  # makes still running
    ops_refused: int = 0  # makes, resets, renders refused for a full queue (server/fair_ops.py)
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
