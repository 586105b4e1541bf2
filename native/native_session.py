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
in flight (it forgets the ready ones), ``render`` while envs are in flight;
``async_reset`` waits for the envs in flight, drops their results, resets
every env and makes them all READY in env order.

Threading: every call takes the session's lock (the doorbell thread holds it
while it serves a request), so callers on several threads are serialised
against the doorbell; ``lock()`` holds the doorbell off for a caller's own
work and may be held around other calls of the same thread.  Blocking calls
(reset, step, recv, async_reset, close) release the GIL while they wait.

This first version is a facade in Python over NativeVec, AsyncBatches and
NativeFast; the books and the doorbell move into C (native/src/session.c)
behind the same API.
"""
from __future__ import annotations

import collections
import threading

import numpy as np

from envd.errors import EnvdError, EnvStateError, InvalidArgumentError
from envd.native.native_vec import AsyncBatches, NativeFast, NativePool, NativeVec
from envd.native.registry import EnvSpec
from envd.vector_base import (in_flight_error, not_idle_error, ready_error, recv_short_error)

_IDLE, _IN_FLIGHT, _READY = 0, 1, 2


class NativeSession:
    """num_envs envs of spec over buffers (envd.vector_base.buffer_layout),
    stepped on pool (None: serially on the calling thread)."""

    def __init__(self, spec: EnvSpec, num_envs: int, *, autoreset_mode: int,
                 max_episode_steps: int, params: list[float], buffers: dict[str, np.ndarray],
                 pool: NativePool | None):
        self.spec = spec
        self.num_envs = num_envs
        self._fast: NativeFast | None = None
        self._batches: AsyncBatches | None = None
        self._vec: NativeVec | None = NativeVec(
            spec, num_envs, autoreset_mode=autoreset_mode, max_episode_steps=max_episode_steps,
            params=params, buffers=buffers, pool=pool)
        self._batches = AsyncBatches(self._vec)
        self._state = np.zeros(num_envs, np.int8)
        self._ready: collections.deque[np.ndarray] = collections.deque()
        self._num_ready = self._num_in_flight = 0
        self._error: EnvdError | None = None
        self._steps = self._async_env_steps = 0
        self._doorbell_served = (0, 0)  # of doorbells stopped
        # The session's lock: the doorbell's mutex while one runs; re-entrant
        # for the thread holding lock().
        self._owner: int | None = None
        self._depth = 0
        self._plain = threading.Lock()

    # ---- the session's lock ---------------------------------------------------------------
    def _enter(self) -> None:
        me = threading.get_ident()
        if self._owner == me:
            self._depth += 1
            return
        self._plain.acquire()
        if self._fast is not None:
            self._fast.lock()
        self._owner, self._depth = me, 1

    def _leave(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._owner = None
            if self._fast is not None:
                self._fast.unlock()
            self._plain.release()

    def lock(self) -> None:
        """Wait for the request the doorbell serves, then hold requests off
        (and every other thread's calls) until unlock().  The holder may call
        the session's other methods meanwhile."""
        self._enter()

    def try_lock(self) -> bool:
        """lock() if nobody holds the lock now (never blocks)."""
        me = threading.get_ident()
        if self._owner == me:
            self._depth += 1
            return True
        if not self._plain.acquire(False):
            return False
        if self._fast is not None and not self._fast.try_lock():
            self._plain.release()
            return False
        self._owner, self._depth = me, 1
        return True

    def unlock(self) -> None:
        self._leave()

    def _live(self) -> NativeVec:
        if self._vec is None:
            raise EnvStateError(f"{self.spec.id}: this native session is closed")
        return self._vec

    # ---- whole-vec calls ---------------------------------------------------------------
    def seed(self) -> None:
        """Seed every env's generator from the reset_seeds buffer (no reset)."""
        self._enter()
        try:
            self._live().seed()
        finally:
            self._leave()

    def _check_idle(self, call: str) -> None:
        in_flight = self._num_in_flight + self._doorbell_pending()
        if in_flight:
            raise in_flight_error(self.spec.id, call, in_flight)
        if self._num_ready and call == "step":
            raise ready_error(self.spec.id, self._num_ready)

    def _forget_ready(self) -> None:
        self._ready.clear()
        self._num_ready = 0
        self._state[:] = _IDLE
        self._error = None

    def reset(self, with_seeds: bool, with_mask: bool) -> None:
        """Reset (the envs in reset_mask, or all), reseeding from reset_seeds
        first if with_seeds.  Refused while envs are in flight; forgets the
        ready ones."""
        self._enter()
        try:
            vec = self._live()
            self._check_idle("reset")
            self._forget_ready()
            vec.reset(with_seeds, with_mask)
        finally:
            self._leave()

    def step(self) -> int:
        """Step every env; the number of episodes that ended."""
        self._enter()
        try:
            vec = self._live()
            if self._num_in_flight or self._num_ready or self._fast is not None:
                self._check_idle("step")
            num_done = vec.step()
            self._steps += 1
            return num_done
        finally:
            self._leave()

    def step_submit(self) -> bool:
        """Start a step on the pool (the pool's eventfd fires when it ends),
        or run it inline when cheap: True when it finished already (no eventfd
        event comes then).  Then step_finish once step_done."""
        self._enter()
        try:
            vec = self._live()
            self._check_idle("step")
            vec.step_submit()
            return vec.step_done()
        finally:
            self._leave()

    def step_done(self) -> bool:
        return self._live().step_done()

    def step_finish(self) -> int:
        """End a submitted step once step_done(); as step()."""
        self._enter()
        try:
            num_done = self._live().step_finish()
            self._steps += 1
            return num_done
        finally:
            self._leave()

    # ---- async -------------------------------------------------------------------------
    def async_reset(self, with_seeds: bool) -> None:
        """Wait for the envs in flight, drop their results, reset every env
        and make them all READY in env order."""
        self._enter()
        try:
            vec = self._live()
            if self._doorbell_pending():
                raise in_flight_error(self.spec.id, "async_reset", self._doorbell_pending())
            while self._batches:
                self._batches.wait_oldest()
                self._collect()
            self._forget_ready()
            vec.reset(with_seeds, False)
            self._ready.append(np.arange(self.num_envs, dtype=np.int64))
            self._num_ready = self.num_envs
            self._state[:] = _READY
        finally:
            self._leave()

    def send(self, env_ids: np.ndarray, notify: bool = False) -> None:
        """Start stepping env_ids (int64) with their rows of the actions
        buffer; returns at once (or after running them inline when cheap).
        notify: the pool's eventfd fires when a batch finishes (the daemon)."""
        ids = np.ascontiguousarray(env_ids, dtype=np.int64)
        self._enter()
        try:
            vec = self._live()
            if self._fast is not None:
                raise EnvStateError(f"{self.spec.id}: send while the doorbell serves this "
                                    "session's sends; ring the doorbell")
            if len(ids) and ids.min() >= 0 and ids.max() < self.num_envs:
                busy = np.flatnonzero(self._state[ids] != _IDLE)
                if len(busy):
                    index = int(ids[busy[0]])
                    raise not_idle_error(self.spec.id, index, self._state[index] == _IN_FLIGHT)
            self._batches.submit(ids, notify)  # refuses ranges, repeats, actions
            self._state[ids] = _IN_FLIGHT
            self._num_in_flight += len(ids)
            self._collect()  # early finishers keep the ready order
        finally:
            self._leave()

    def _collect(self) -> None:
        finished, error = self._batches.collect()
        for ids in finished:
            self._state[ids] = _READY
            self._ready.append(ids)
            self._num_ready += len(ids)
            self._num_in_flight -= len(ids)
            self._async_env_steps += len(ids)
        self._error = self._error or error

    def _take_error(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _pop_ready(self, count: int) -> np.ndarray:
        parts = []
        while count:
            head = self._ready[0]
            if len(head) <= count:
                parts.append(self._ready.popleft())
            else:
                parts.append(head[:count])
                self._ready[0] = head[count:]
            count -= len(parts[-1])
        ids = np.concatenate(parts) if len(parts) > 1 else parts[0].copy()
        self._num_ready -= len(ids)
        self._state[ids] = _IDLE
        return ids

    def _check_recv(self, count: int) -> None:
        if not 1 <= count <= self.num_envs:
            raise InvalidArgumentError(f"{self.spec.id}: a recv takes 1 to {self.num_envs} envs,"
                                       f" got {count}")
        if self._fast is not None:
            raise EnvStateError(f"{self.spec.id}: recv while the doorbell serves this "
                                "session's recvs; ring the doorbell")
        if self._num_ready + self._num_in_flight < count:
            self._take_error()  # a failed env explains it better
            raise recv_short_error(self.spec.id, count, self._num_ready + self._num_in_flight)
        self._collect()
        self._take_error()

    def recv(self, count: int) -> np.ndarray:
        """Block until count envs are ready; exactly the count oldest ready
        ids (int64), the rest stay ready.  Raises the first failure of an env
        in a finished batch (its envs stay ready for the next recv)."""
        self._enter()
        try:
            self._live()
            self._check_recv(count)
            while self._num_ready < count:
                self._batches.wait_oldest()
                self._collect()
                self._take_error()
            return self._pop_ready(count)
        finally:
            self._leave()

    def try_recv(self, count: int) -> np.ndarray | None:
        """recv without blocking: None while fewer than count envs are ready
        (raises as recv does)."""
        self._enter()
        try:
            self._live()
            self._check_recv(count)
            return self._pop_ready(count) if self._num_ready >= count else None
        finally:
            self._leave()

    def counts(self) -> tuple[int, int]:
        """(envs in flight, envs ready); in flight includes the doorbell's
        envs sent and not received (this facade cannot tell them apart)."""
        self._enter()
        try:
            if self._batches:
                self._collect()
            return self._num_in_flight + self._doorbell_pending(), self._num_ready
        finally:
            self._leave()

    # ---- the doorbell ------------------------------------------------------------------
    def _doorbell_pending(self) -> int:
        return self._fast.pending() if self._fast is not None else 0

    def start_doorbell(self, segment, ids: np.ndarray, spin_ns: int) -> None:
        """Serve the steps, sends and recvs rung at the doorbell in the header
        page of segment (a writable buffer: the session's shared-memory
        mapping); sends and recvs pass env ids through ids (int64, num_envs,
        a view of the same segment).  Refused while envs are in flight or
        ready, or a doorbell serves already."""
        self._enter()
        try:
            vec = self._live()
            if self._fast is not None:
                raise EnvStateError(f"{self.spec.id}: the doorbell is served already")
            if self._num_in_flight or self._num_ready:
                raise EnvStateError(f"{self.spec.id}: the doorbell starts only while no env "
                                    "is in flight or ready")
            fast = NativeFast(vec, segment, ids, spin_ns)
            fast.lock()  # held as the session's lock until _leave
            self._fast = fast
        finally:
            self._leave()

    def stop_doorbell(self) -> None:
        """Stop serving the doorbell (after the request it serves), drop the
        envs sent through it and not received, and mark it closed.
        Idempotent."""
        self._enter()
        fast = self._fast
        if fast is None:
            self._leave()
            return
        self._fast = None
        fast.unlock()  # stop() destroys the mutex: nobody may hold it
        try:
            fast.stop()
            steps, envs = fast.served()
            before = self._doorbell_served
            self._doorbell_served = (before[0] + steps, before[1] + envs)
        finally:
            self._leave()

    def drain(self) -> None:
        """Answer every later doorbell request with 'shutting down'."""
        if self._fast is not None:
            self._fast.drain()

    def served(self) -> tuple[int, int]:
        """(whole steps, async env steps found finished) so far, by every path:
        direct calls and the doorbell.  Never blocks."""
        steps = self._steps + self._doorbell_served[0]
        envs = self._async_env_steps + self._doorbell_served[1]
        fast = self._fast
        if fast is not None:
            fast_steps, fast_envs = fast.served()
            steps, envs = steps + fast_steps, envs + fast_envs
        return steps, envs

    # ---- other -------------------------------------------------------------------------
    def render(self, out: np.ndarray) -> None:
        """Draw every env's current state into out ((num_envs,) +
        spec.render_shape uint8, C-contiguous).  Refused while envs are in
        flight."""
        self._enter()
        try:
            vec = self._live()
            in_flight = self._num_in_flight + self._doorbell_pending()
            if in_flight:
                raise in_flight_error(self.spec.id, "render", in_flight)
            vec.render(out)
        finally:
            self._leave()

    def stats(self) -> dict[str, float]:
        """The backend's dispatch statistics (cost per env step, inline and
        pooled jobs, last chunk)."""
        self._enter()
        try:
            return self._live().stats()
        finally:
            self._leave()

    def set_chunk(self, chunk: int) -> None:
        """Force a chunk size (>= 1) or return to adaptive dispatch (0)."""
        self._enter()
        try:
            self._live().set_chunk(chunk)
        finally:
            self._leave()

    def close(self) -> None:
        """Stop the doorbell, wait for what is in flight, free the envs.
        Idempotent."""
        if getattr(self, "_vec", None) is None:
            return
        self.stop_doorbell()
        self._enter()
        try:
            if self._batches is not None:
                self._batches.close()
                self._batches = None
            if self._vec is not None:
                self._vec.destroy()
                self._vec = None
        finally:
            self._leave()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
