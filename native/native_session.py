"""NativeSession: one native session -- a stepping backend, its async books and
the optional doorbell server -- serving every caller of one set of envs.

The in-process VecEnv uses it as its stepper (envd.stepping.Stepper); the
daemon's stepping handlers call it for the socket path and start its doorbell
for the same-host fast path.  Every caller goes through the same books, so
the paths agree by construction.

Books (EnvPool's rules, see envd.stepping): each env is IDLE, IN_FLIGHT or
READY; READY ids form a FIFO in the order their batches were found finished
(batches checked in submit order); the first env failure of a finished batch
is kept for the next recv (its envs are ready all the same).  ``recv(count)``
returns exactly ``count`` ids and keeps the rest ready.  ``send`` refuses an
env that is not IDLE (EnvStateError naming the env and whether it is in
flight or ready), a repeated id or an id out of range (InvalidArgumentError);
``step`` refuses while envs are in flight or ready, ``reset`` while envs are
in flight (it forgets the ready ones), ``render`` while envs are in flight
or ready (whether a batch sent has finished depends on the threads; that
every env was received does not);
``async_reset`` waits for the envs in flight, drops their results, resets
every env and makes them all READY in env order; ``seed`` refuses while envs
are in flight.

Threading: every call takes the session's lock (the doorbell thread holds it
while it serves a request), so callers on several threads are serialised
against the doorbell; ``lock()`` holds the doorbell off for a caller's own
work and may be held around other calls of the same thread.  Blocking calls
(reset, step, recv, async_reset, close) release the GIL while they wait.

Front doors: step, send and recv/try_recv are the in-process front door of the
request engine (native/src/engine.h), beside the daemon's loop and the
doorbell thread: the session keeps the one request of all three doors, so
beside another door's request a step or recv is refused (EnvStateError, the
envs busy) and a send is served beside a waiting recv, refused beside any
other.  The whole-vec calls (seed, reset, async_reset, render) ask the same
rule: beside another door's request they are refused (EnvStateError naming
that request, nothing changed).  In-process, no other door shares the
session: the rule is the engine's, and costs the step a load and a branch.

The books and the serving live in C (native/src/session.h); this class is
its thin cffi wrapper, which turns codes into envd errors with the messages
of envd.vec_errors.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Protocol, overload

import numpy as np
from gymnasium import spaces

from envd import make_options as options
from envd.errors import EnvStateError, InvalidArgumentError, NativeError
from envd.native._envd_call import Bound, call
from envd.native._envd_native import ffi, lib
from envd.native.native_vec import NativePool, per_env_params, ptr, strerror, vec_buffers, vec_config
from envd.native.registry import EnvSpec
from envd.vec_errors import (
    claimed_error,
    in_flight_error,
    not_idle_error,
    ready_error,
    recv_short_error,
    send_error,
    step_error,
)


def _address(cdata: Any) -> int:
    """A cffi pointer (a function's or a handle) as an integer."""
    return int(ffi.cast("uintptr_t", cdata))


#: the kinds of request a front door claims (envd_session_claimed), as a
#: refusal names them
_REQUEST_NAMES = {int(lib.ENVD_REQ_STEP): "step", int(lib.ENVD_REQ_RECV): "recv",
                  int(lib.ENVD_REQ_SETTLE): "settle", int(lib.ENVD_REQ_SEND): "send"}
#: the whole-vec calls the session refuses beside another front door's request
_WHOLE_VEC_CALLS = frozenset({"reset", "async_reset", "render", "seed"})

#: the addresses envd.native._envd_call binds (bare_step)
_STEP = _address(ffi.addressof(lib, "envd_session_step"))
_STEP_IF_SHORT = _address(ffi.addressof(lib, "envd_session_step_if_short"))


class SessionSpec(Protocol):
    """What a session reads of its envs' spec: a native env's EnvSpec, or a
    hosted env's HostedSpec (native/hosted_session.py)."""

    @property
    def id(self) -> str: ...

    @property
    def num_agents(self) -> int: ...

    @property
    def action_space(self) -> spaces.Space[Any]: ...

    @property
    def render_shape(self) -> tuple[int, ...] | None: ...


class NativeSession:
    """num_envs envs of spec over buffers (envd.buffer_layout),
    stepped on pool (None: serially on the calling thread).  The pool must
    outlive the session.  max_threads caps the pool threads that step these
    envs at once (None: no cap; 0: every call inline on the thread serving
    it; at most the pool's threads, make_options.check_max_threads; see
    envd_vec_set_max_threads in native/src/vec.h).  seeded: the
    reset_seeds buffer holds each env's seed already, which the envs are
    created with (their RNGs, and an ABI 5 env's seed callback before init).
    private_rows: the buffers are this process's own (in-process), not
    shared memory a client can write (see vec_config)."""

    def __init__(self, spec: EnvSpec, num_envs: int, *, autoreset_mode: int,
                 max_episode_steps: int, params: list[float], buffers: dict[str, np.ndarray],
                 pool: NativePool | None, max_threads: int | None = None,
                 seeded: bool = False, private_rows: bool = False):
        # (make's option, a daemon's only: the daemon's make checked it already
        # against this pool; checked again as the options define it)
        max_threads = options.check_max_threads(max_threads,
                                                0 if pool is None else pool.num_threads)
        self.spec: SessionSpec = spec
        self.num_envs = num_envs
        self.handle = ffi.NULL
        self._buffers = buffers  # the memory lives as long as the session
        self._params = ffi.new("double[]", params or [0.0])
        self._c_buffers = vec_buffers(spec, buffers)
        self._seeds_ptr = ptr(buffers["reset_seeds"], "uint64_t *")
        self._mask_ptr = ptr(buffers["reset_mask"], "bool *")
        self._doorbell_refs: tuple | None = None  # the doorbell's memory, while it serves
        backend = ffi.new("envd_backend_t **")
        rc = lib.envd_backend_pool_create(
            backend, spec.definition,
            vec_config(num_envs, autoreset_mode, max_episode_steps, self._params,
                       per_env_params(spec, num_envs, params),
                       self._seeds_ptr if seeded else ffi.NULL, private_rows),
            self._c_buffers, ffi.NULL if pool is None else pool.handle)
        self._check(rc, f"creating {num_envs} {spec.id} envs")
        out = ffi.new("envd_session_t **")
        self._check(lib.envd_session_create(out, backend[0]), "creating the session")
        self.handle = out[0]
        self._bind_step(may_hold_gil=True)
        self.max_threads = max_threads
        if max_threads is not None:  # nothing is in flight yet: it cannot be busy
            self._check(lib.envd_session_set_max_threads(self.handle, max_threads),
                        f"capping the session at {max_threads} threads")
        # The backend's private copy of the actions it checked (the buffer may
        # be shared memory a client rewrites): errors name the action it refused.
        actions = buffers["actions"]
        self._checked = {**buffers, "actions": np.frombuffer(
            ffi.buffer(lib.envd_session_checked_actions(self.handle), actions.nbytes),
            actions.dtype).reshape(actions.shape)}

    # ---- errors ------------------------------------------------------------------------
    def _check(self, rc: int, what: str) -> None:
        if rc != lib.ENVD_OK:
            raise NativeError(f"{self.spec.id}: {what} failed: {strerror(rc)} ({rc})", rc)

    def _live(self):
        if self.handle == ffi.NULL:
            raise EnvStateError(f"{self.spec.id}: this native session is closed")
        return self.handle

    def _index(self, index: int | None) -> int:
        """index, the env an error names as a completion recorded it; None:
        the session's, read now (right after the call, on its thread)."""
        return int(lib.envd_session_error_index(self.handle)) if index is None else index

    def _refusal(self, rc: int, call: str, index: int | None = None) -> Exception | None:
        """The error of a whole-vec call the session refused for its async
        envs (index -1), else None."""
        if self._index(index) != -1:
            return None
        if rc == lib.ENVD_EBUSY and call in _WHOLE_VEC_CALLS:
            # (read after the refusal: a claim released meanwhile falls back
            # to the counts below)
            claimed = int(lib.envd_session_claimed(self.handle))
            if claimed:
                return claimed_error(self.spec.id, call,
                                     _REQUEST_NAMES.get(claimed, "request"))
        in_flight, ready = self.counts()
        if rc != lib.ENVD_EBUSY or not (in_flight or ready):
            return None
        if call == "step" and not in_flight:
            return ready_error(self.spec.id, ready)
        # Counted after the refusal: envs in flight then may be ready now (their
        # batch finished meanwhile), so a reset refused for envs in flight may
        # find none; it was refused all the same.
        return in_flight_error(self.spec.id, call, in_flight or ready)

    def _row_of(self, env: int, rc: int, num_agents: int) -> int:
        """The row an error of env names (multi-agent envs; C names envs): the
        first row of env whose checked action is outside the space for a
        refused action, else the env's first row."""
        rows = range(env * num_agents, (env + 1) * num_agents)
        if rc == lib.ENVD_ERANGE:
            actions = self._checked["actions"]
            for row in rows:
                if not self.spec.action_space.contains(actions[row]):
                    return row
        return rows[0]

    def _refused_env_error(self, rc: int, env: int,
                           num_envs: int | None = None) -> Exception:
        """step_error (send_error given num_envs) of env's failure or refusal:
        the one place the session names it.  Errors name rows: a multi-agent
        env's first row (its refused action's row for ERANGE), as a step's
        do; ESTATE's wording comes from the backend's own books, never from
        the flags in the buffers (shared memory a client writes, in the
        daemon)."""
        never_reset = None
        if rc == lib.ENVD_ESTATE and env >= 0:
            never_reset = lib.envd_session_env_started(self.handle, env) == 0
        num_agents = self.spec.num_agents
        if rc in (lib.ENVD_ERANGE, lib.ENVD_ESTATE, lib.ENVD_EENV) and env >= 0 and num_agents > 1:
            env = self._row_of(env, rc, num_agents)
        if num_envs is not None:
            return send_error(self.spec.id, self.spec.action_space, num_envs, rc, env,
                              self._checked, never_reset=never_reset)
        return step_error(self.spec.id, self.spec.action_space, rc, env, self._checked,
                          never_reset=never_reset)

    def _step_error(self, rc: int, call: str = "step", index: int | None = None) -> BaseException:
        refusal = self._refusal(rc, call, index)
        if refusal is not None:
            return refusal
        index = self._index(index)
        if rc in (lib.ENVD_ERANGE, lib.ENVD_ESTATE, lib.ENVD_EBUSY, lib.ENVD_EENV):
            return self._refused_env_error(rc, index)
        return NativeError(f"{self.spec.id}: {call} failed: {strerror(rc)} ({rc})", rc)

    # ---- the session's lock ------------------------------------------------------------
    def lock(self) -> None:
        """Wait for the request the doorbell serves, then hold requests off
        (and every other thread's calls) until unlock().  The holder may call
        the session's other methods meanwhile."""
        lib.envd_session_lock(self._live())

    def try_lock(self) -> bool:
        """lock() if nobody else holds the lock now (never blocks)."""
        return bool(lib.envd_session_trylock(self._live()))

    def unlock(self) -> None:
        lib.envd_session_unlock(self.handle)

    # ---- whole-vec calls ---------------------------------------------------------------
    def seed(self) -> None:
        """Seed every env's generator from the reset_seeds buffer (no reset).
        Refused while envs are in flight (their batches use the generators),
        or beside another front door's request."""
        rc = lib.envd_session_seed(self._live(), self._seeds_ptr)
        if rc != lib.ENVD_OK:
            raise self._refusal(rc, "seed") or NativeError(
                f"{self.spec.id}: seed failed: {strerror(rc)} ({rc})", rc)

    def reset(self, with_seeds: bool, with_mask: bool) -> None:
        """Reset (the envs in reset_mask, or all), reseeding from reset_seeds
        first if with_seeds.  Refused while envs are in flight; forgets the
        ready ones.  Blocks; releases the GIL while it runs."""
        handle = self._live()
        rc = lib.envd_session_reset(handle, self._seeds_ptr if with_seeds else ffi.NULL,
                                    self._mask_ptr if with_mask else ffi.NULL)
        if rc != lib.ENVD_OK:
            raise self._refusal(rc, "reset") or NativeError(
                f"{self.spec.id}: reset failed: {strerror(rc)} ({rc})", rc)
        # Checked on the backend's copy of the mask (the buffer may be shared
        # memory a client rewrites); an empty mask reset nothing, so refusing
        # it now is refusing it before.
        if with_mask and lib.envd_session_reset_count(handle) == 0:
            raise InvalidArgumentError("options['reset_mask'] must have at least one True value")

    def step(self) -> int:
        """Step every env; the number of episodes that ended.  Refused while
        envs are in flight or ready."""
        num_done = lib.envd_session_step(self.handle)  # (the hot path: NULL once closed)
        if num_done < 0:
            self._live()
            raise self._step_error(num_done)
        return num_done

    def _bind_step(self, may_hold_gil: bool) -> None:
        """step() as one bound native call (bare_step), cleared by close();
        may_hold_gil: a short step keeps the GIL (envd_session_step_if_short),
        else every step releases it."""
        self._bound_step = Bound(_STEP, _address(self.handle),
                                 _STEP_IF_SHORT if may_hold_gil else 0)

    def bare_step(self) -> tuple[Callable[[Any], int], Any]:
        """step() as one bare call, for a caller whose every step counts
        (BatchedVecEnv's step paths): a function and its argument,
        envd.native._envd_call's call and this session's envd_session_step
        bound to its handle.  function(argument) returns the episodes that
        ended or a negative code, which step_result(code) turns into step()'s
        error.  It keeps the GIL through a step measured short whose lock
        is free and releases it for any other (envd_session_step_if_short,
        session.h), where a cffi call always releases it; a hosted
        session's always releases it.  After close() it is refused
        (ENVD_EINVAL); a call must not race close() (no other thread may use
        the session meanwhile: BatchedVecEnv's claim)."""
        self._live()
        return call, self._bound_step

    def step_result(self, result: int, index: int | None = None) -> int:
        """The envs whose episode ended, of a step's result (a request
        engine's completion, envd.native.request_engine, and the env its
        error names: index), or its error raised: without index, read right
        after the call that made it, on its thread."""
        if result < 0:
            raise self._step_error(result, index=index)
        return result

    # ---- async -------------------------------------------------------------------------
    def async_reset(self, with_seeds: bool) -> None:
        """Wait for the envs in flight, drop their results, reset every env
        and make them all READY in env order."""
        rc = lib.envd_session_async_reset(self._live(),
                                          self._seeds_ptr if with_seeds else ffi.NULL)
        if rc != lib.ENVD_OK:
            raise self._refusal(rc, "async_reset") or NativeError(
                f"{self.spec.id}: async_reset failed: {strerror(rc)} ({rc})", rc)

    def send(self, env_ids: np.ndarray, notify: bool = False) -> None:
        """Start stepping env_ids (int64) with their rows of the actions
        buffer; returns at once (or after running them inline when cheap).
        notify: the pool's eventfd fires when a batch finishes (the daemon)."""
        ids = np.ascontiguousarray(env_ids, dtype=np.int64)
        handle = self._live()
        rc = lib.envd_session_send(handle, ffi.from_buffer("int64_t[]", ids), len(ids),
                                   lib.ENVD_JOB_NOTIFY if notify else 0)
        if rc != lib.ENVD_OK:
            raise self.send_error(rc)

    def send_error(self, rc: int, index: int | None = None) -> BaseException:
        """The error of a send refused with rc, naming env index (None: the
        session's, read right after the refusal, on its thread)."""
        handle = self.handle
        index = self._index(index)
        if rc == lib.ENVD_EBUSY and 0 <= index < self.num_envs:
            state = lib.envd_session_env_state(handle, index)
            if state != lib.ENVD_ENV_IDLE:
                return not_idle_error(self.spec.id, index, state == lib.ENVD_ENV_IN_FLIGHT)
        return self._refused_env_error(rc, index, self.num_envs)

    @overload
    def _recv(self, count: int, wait: Literal[True]) -> np.ndarray: ...
    @overload
    def _recv(self, count: int, wait: bool) -> np.ndarray | None: ...

    def _recv(self, count: int, wait: bool) -> np.ndarray | None:
        handle = self._live()
        if not 1 <= count <= self.num_envs:
            raise InvalidArgumentError(f"{self.spec.id}: a recv takes 1 to {self.num_envs} "
                                       f"envs, got {count}")
        ids = np.empty(count, np.int64)  # (per call: callers on other threads get their own)
        # (from_buffer: a fifth of the cost of ptr's array.ctypes, on every recv)
        got = lib.envd_session_recv(handle, count, count, ffi.from_buffer("int64_t[]", ids),
                                    int(wait))
        if got > 0:
            return ids
        if got == 0:
            return None
        raise self.recv_error(got, count)

    def recv_error(self, rc: int, count: int, index: int | None = None) -> BaseException:
        """The error of a recv of count envs (at least: its min) that failed
        with rc: too few sent, or the kept failure of a finished batch, naming
        env index (None: the session's, read right after the recv, on its
        thread)."""
        index = self._index(index)
        if rc == lib.ENVD_ESTATE and index == -1:
            return recv_short_error(self.spec.id, count, sum(self.counts()))
        return self._refused_env_error(rc, index)

    def recv(self, count: int) -> np.ndarray:
        """Block until count envs are ready; exactly the count oldest ready
        ids (int64), the rest stay ready.  Raises the first failure of an env
        in a finished batch (its envs stay ready for the next recv)."""
        return self._recv(count, True)

    def try_recv(self, count: int) -> np.ndarray | None:
        """recv without blocking: None while fewer than count envs are ready
        (raises as recv does)."""
        return self._recv(count, False)

    def counts(self) -> tuple[int, int]:
        """(envs in flight, envs ready), after collecting finished batches."""
        in_flight, ready = ffi.new("int64_t *"), ffi.new("int64_t *")
        lib.envd_session_counts(self._live(), in_flight, ready)
        return int(in_flight[0]), int(ready[0])

    # ---- the doorbell ------------------------------------------------------------------
    def start_doorbell(self, segment, ids: np.ndarray, spin_ns: int) -> None:
        """Serve the steps, sends and recvs rung at the doorbell in the header
        page of segment (a writable buffer: the session's shared-memory
        mapping) from a native thread; sends and recvs pass env ids through
        ids (int64, num_envs, a view of the same segment).  The doorbell's
        requests use this session's books, like every other call."""
        handle = self._live()
        memory = ffi.from_buffer(segment)
        header = ffi.cast("envd_doorbell_header_t *", memory + lib.ENVD_DOORBELL_OFFSET)
        rc = lib.envd_doorbell_serve(handle, header, ptr(ids, "int64_t *"), spin_ns)
        if rc == lib.ENVD_EBUSY:
            raise EnvStateError(f"{self.spec.id}: the doorbell is served already")
        self._check(rc, "starting the doorbell")
        self._doorbell_refs = (memory, ids)

    def stop_doorbell(self) -> None:
        """Stop serving the doorbell (after the request it serves), drop the
        envs in flight or ready, and mark it closed.  Idempotent."""
        if self.handle != ffi.NULL:
            lib.envd_session_stop_server(self.handle)
        self._doorbell_refs = None

    def drain(self) -> None:
        """Answer every later doorbell request with 'shutting down'."""
        if self.handle != ffi.NULL:
            lib.envd_session_drain(self.handle)

    def served(self) -> tuple[int, int]:
        """(whole steps, async env steps found finished) so far, by every path:
        direct calls and the doorbell.  Finished batches are collected first
        unless another thread holds the session's lock (the doorbell serving
        a request, which then collects them itself).  Never blocks."""
        handle = self._live()
        if lib.envd_session_trylock(handle):
            lib.envd_session_counts(handle, ffi.NULL, ffi.NULL)
            lib.envd_session_unlock(handle)
        return (int(lib.envd_session_steps(handle)),
                int(lib.envd_session_async_env_steps(handle)))

    # ---- other -------------------------------------------------------------------------
    def render(self, out: np.ndarray) -> None:
        """Draw every env's current state into out ((num_envs,) +
        spec.render_shape uint8, C-contiguous).  Refused while envs are in
        flight or ready (not received yet).  Blocks."""
        handle = self._live()
        frame_bytes = int(lib.envd_session_frame_bytes(handle))
        in_flight, ready = self.counts()
        if in_flight or ready:
            raise in_flight_error(self.spec.id, "render", in_flight + ready)
        if (out.dtype != np.uint8 or not out.flags.c_contiguous
                or out.nbytes != frame_bytes * self.num_envs or frame_bytes == 0):
            raise InvalidArgumentError(
                f"rendering {self.spec.id}: a frame buffer of shape "
                f"{(self.num_envs,) + (self.spec.render_shape or ())} uint8 is needed")
        rc = lib.envd_session_render(handle, ptr(out, "uint8_t *"))
        if rc == lib.ENVD_OK:
            return
        index = int(lib.envd_session_error_index(handle))
        refusal = self._refusal(rc, "render")
        if refusal is not None:
            raise refusal
        if rc == lib.ENVD_ESTATE:
            raise EnvStateError(f"{self.spec.id}: env {index} has not been reset; "
                                "call reset() before render()")
        self._check(rc, f"rendering env {index}")

    def stats(self) -> dict[str, float]:
        """The backend's dispatch statistics: cost per env step (ns), inline
        and pooled jobs, last chunk, a blocking step's wall time per env
        inline and pooled (ns)."""
        stats = ffi.new("envd_vec_stats_t *")
        lib.envd_session_stats(self._live(), stats)
        return {"cost_ns_per_env": stats.cost_ns_per_env, "inline_jobs": stats.inline_jobs,
                "pooled_jobs": stats.pooled_jobs, "last_chunk": stats.last_chunk,
                "inline_step_ns_per_env": stats.inline_step_ns_per_env,
                "pooled_step_ns_per_env": stats.pooled_step_ns_per_env}

    def set_chunk(self, chunk: int) -> None:
        """Force a chunk size (>= 1) or return to adaptive dispatch (0)."""
        lib.envd_session_set_chunk(self._live(), chunk)

    def close(self) -> None:
        """Stop the doorbell, wait for what is in flight, free the envs.
        Idempotent; no other thread may use the session meanwhile."""
        handle = getattr(self, "handle", ffi.NULL)
        if handle != ffi.NULL:
            self.handle = ffi.NULL
            bound = getattr(self, "_bound_step", None)
            if bound is not None:  # (before the session is freed)
                bound.clear()
            lib.envd_session_destroy(handle)
            self._doorbell_refs = None

    def __del__(self) -> None:
        self.close()
