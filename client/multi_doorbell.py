"""Async mode over several daemons through their doorbells (the same-host
fast path): ShardsAsyncStepper's books, other wires.

Where every shard of an async MultiVecEnv has the fast path, sends and recvs
go through each session's doorbell instead of messages (no socket round
trip, no Python on the daemon's side):

- ``send``: each daemon's part is rung as one request.  Where the part is
  all that daemon's envs (EnvPool's loop with a batch per daemon), a
  SENDRECV: the send and the recv of them all, answered once, when the batch
  finished.  The trainer goes on at once, and the daemon's thread (asleep
  on a small machine while the trainer serves the other daemons) is woken
  once per batch instead of twice: each wake-up costs the trainer tens of
  microseconds.  Its refusal is raised by the next call, naming the daemon,
  as a posted send's over the socket.  Any other part: a SEND, answered at
  once (its refusal is raised by the send itself, naming the daemon); no
  SENDRECV there, as a send to that daemon before its answer would wait for
  it.  A request still out on that daemon is waited for first (a doorbell
  takes one request at a time: it is answered as soon as one of that
  daemon's batches finished);
- waiting: every daemon with envs in flight and no request rung gets one
  RECV of the smallest batch it still has in flight (so any batch that
  finishes answers it; the daemon keeps the rest of a larger one ready for
  the next RECV).  While an answer is expected within 60 us (each daemon's
  running estimate of how long after its ring an answer came), the trainer
  spins on the answer words: a sleeping trainer's wake-up costs it and the
  daemon tens of microseconds, about a cheap env's batch.  An answer seen
  only after a sleep looks later than it came (by the wake-up), which could
  keep the estimate above 60 us for good: so a daemon without an estimate,
  and every 16th wait, spin at least 60 us whatever it says, and an answer
  seen while spinning replaces the estimate (slept ones are averaged in).
  Otherwise it
  sleeps on all of them at once (futex_waitv, client/doorbell.py
  ``wait_any``), in slices of 20 ms.  A daemon that did not answer has its
  connection monitor read once a slice passed without any answer, and at
  least once a slice (a daemon that died is named then).

Everything else (the books, the ready FIFO, where a recv's rows are
gathered from, refusals, a lost daemon, async_reset) is ShardsAsyncStepper's.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, cast

import numpy as np

from envd.client.doorbell import RECV, SENDRECV, SHUTTING_DOWN, Doorbell, wait_any
from envd.client.multi_async import IDLE, IN_FLIGHT, ShardsAsyncStepper, _Shard
from envd.errors import ConnectionLostError, EnvdError, EnvdTimeoutError, ProtocolError, ShuttingDownError
from envd.vec_errors import step_error

if TYPE_CHECKING:
    from envd.client.multi import MultiVecEnv
    from envd.client.transports import DoorbellStepper

#: longest sleep before the daemons' connection monitors are read again
_SLICE_S = 0.02
#: spin (not sleep) while an answer is expected within this: a sleeping
#: trainer's wake-up costs it and the daemon that wakes it tens of
#: microseconds, as much as a cheap env's batch (docs/benchmarks.md)
_SPIN_WITHIN_S = 60e-6
#: spin up to this long past the expected answer (so at most
#: _SPIN_WITHIN_S + _SPIN_MARGIN_S in all; an answer overdue by more is
#: slept for)
_SPIN_MARGIN_S = 20e-6
#: weight of the latest answer in each daemon's running estimate
_EXPECTED_WEIGHT = 0.25
#: every this many waits spin at least _SPIN_WITHIN_S whatever the estimates
#: say (a probe: an answer seen after a sleep includes the wake-up, so the
#: estimates only ever fall back below _SPIN_WITHIN_S through a spin)
_PROBE_EVERY = 16


def _bell_stepper(shard: _Shard) -> DoorbellStepper:
    """shard's stepper: a DoorbellStepper wherever this module runs (every
    shard has the fast path: MultiVecEnv._async_stepper)."""
    return cast("DoorbellStepper", shard.stepper)


def _rung_bell(shard: _Shard) -> Doorbell:
    """The doorbell of a shard with a request rung (_ring_recv and _post_send
    ring only a doorbell that is there)."""
    bell = _bell_stepper(shard).doorbell
    assert bell is not None
    return bell


class ShardsDoorbellStepper(ShardsAsyncStepper):
    """ShardsAsyncStepper whose sends and recvs ring each daemon's doorbell."""

    def __init__(self, env: MultiVecEnv):
        super().__init__(env)
        for shard in self._shards:
            shard.rung = 0  # envs a RECV rung and not answered yet asks for (0: none)
            shard.sent_ids = None  # the ids of a SENDRECV rung and not answered yet
            shard.remaining = {}  # batch serial -> its envs still in flight there
            shard.rung_at = 0.0  # when the request out there was rung (perf_counter)
            # how long after its ring an answer came, as seen by a wait for it
            # (an estimate: None until a wait saw one)
            shard.expected = None
            shard.checked_at = 0.0  # when its connection was last checked (monotonic)
        self._serial = 0
        self._waits = 0  # (every _PROBE_EVERY-th spins: _spin)
        self._batch_of = np.zeros(env.num_env_instances, np.int64)  # each env's last batch serial

    # ---- the wire ---------------------------------------------------------------------------
    def _waiting_anywhere(self) -> bool:
        return any(shard.rung for shard in self._shards)

    def _post_send(self, k: int, ids: np.ndarray, run: slice | None) -> None:
        shard = self._shards[k]
        deadline = time.monotonic() + self._timeout
        while shard.rung:  # the doorbell takes one request at a time
            self._wait(deadline, "send", only=shard)
        local = ids - shard.rows.start
        self._copy_actions(shard, ids, local, run)
        bell = _bell_stepper(shard).doorbell
        if len(ids) == shard.rows.stop - shard.rows.start and bell is not None and not bell.closed:
            self._ring_sendrecv(shard, bell, ids, local)
        else:
            self._ring_send(shard, local)  # (a closed doorbell: the socket says why)
        self._serial += 1
        where = run if run is not None else ids
        self._batch_of[where] = self._serial
        shard.remaining[self._serial] = len(ids)
        self._state[where] = IN_FLIGHT
        shard.in_flight += len(ids)

    def _ring_send(self, shard: _Shard, local: np.ndarray) -> None:
        """A SEND of the shard's envs local, answered once the batch started."""
        try:
            _bell_stepper(shard)._send(local)  # rings SEND: answered once the batch started
        except ConnectionLostError as exc:
            raise self._lost(shard, exc) from exc
        except EnvdTimeoutError:
            self._async_lost = True  # the batch may have started: its envs' fate is unknown
            raise
        except EnvdError as exc:
            named = self._named(exc, shard)
            if named is exc:
                raise
            raise named from exc

    def _ring_sendrecv(self, shard: _Shard, bell: Doorbell, ids: np.ndarray,
                       local: np.ndarray) -> None:
        """A send of all the shard's envs: ring it with the recv of them all,
        answered once, when the batch finished (_take_answer).  The trainer
        does not wait for the send, and the daemon's thread wakes once per
        batch.  Only a whole shard: no env of it can be sent before the
        answer, and a later send to the shard would wait for it (a doorbell
        takes one request at a time), where a SEND is answered at once."""
        _bell_stepper(shard)._ids[:len(local)] = local
        bell.ring(SENDRECV, len(local))
        shard.rung, shard.sent_ids = len(local), ids
        shard.rung_at = time.perf_counter()

    def _post_recv(self, k: int) -> None:
        """Nothing here: a RECV is rung only when the trainer waits (_wait)."""

    def _read(self, k: int) -> None:
        """Take in daemon k's RECV if it was answered (never waiting)."""
        shard = self._shards[k]
        bell = _bell_stepper(shard).doorbell
        if shard.rung and bell is not None and bell.answered:
            self._take_answer(shard)

    def _wait(self, deadline: float, call: str, only: _Shard | None = None) -> None:
        """Ring a RECV on every daemon with envs in flight and none rung
        (``only``: just that one's answer is awaited), then wait until an
        answer comes (or a slice passes) and take in what came: spinning
        while one is expected within _SPIN_WITHIN_S (by each daemon's
        running estimate), else asleep."""
        shards = [only] if only is not None else self._shards
        for shard in shards:
            if shard.in_flight and not shard.rung:
                self._ring_recv(shard)
        rung = [shard for shard in shards if shard.rung]
        if not rung:
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            self._async_lost = True
            raise EnvdTimeoutError(
                f"{self._env_id}: no env finished on the daemons at "
                f"{', '.join(shard.endpoint for shard in rung)} within {self._timeout:g} s "
                f"(Client timeout) during {call}(); they are stuck or overloaded")
        bells = [_rung_bell(shard) for shard in rung]
        if not any(bell.answered for bell in bells):
            self._waits += 1
            seen = self._spin(rung, bells, probe=self._waits % _PROBE_EVERY == 0)
            if not seen:
                wait_any(bells, min(remaining, _SLICE_S))
            now = time.perf_counter()
            for shard in rung:  # (only a wait sees when an answer came)
                if _rung_bell(shard).answered:
                    self._learn(shard, now - shard.rung_at, exact=seen)
        any_answered = any(bell.answered for bell in bells)
        checked = time.monotonic()
        for shard in rung:
            if _rung_bell(shard).answered:
                self._take_answer(shard)
            elif not any_answered or checked - shard.checked_at >= _SLICE_S:
                # (a daemon that answered is alive; one that did not is
                # checked once a slice passed without any answer, or every slice)
                shard.checked_at = checked
                self._check_alive(shard, call)

    @staticmethod
    def _learn(shard: _Shard, took: float, exact: bool) -> None:
        """Fold an answer that came `took` after its ring into the shard's
        estimate.  One seen while spinning is exact and replaces it; one seen
        after a sleep includes the wake-up and is averaged in (so a probe's
        exact sample brings an estimate that slept samples held above the
        window back at once)."""
        if exact or shard.expected is None:
            shard.expected = took
        else:
            shard.expected += (took - shard.expected) * _EXPECTED_WEIGHT

    @staticmethod
    def _spin(rung: list[_Shard], bells: list[Doorbell], probe: bool = False) -> bool:
        """Spin on the rung doorbells while the soonest answer is expected
        within _SPIN_WITHIN_S: until one is answered (True), or _SPIN_MARGIN_S
        past it (False).  A probe, or a daemon without an estimate yet: at
        least _SPIN_WITHIN_S from now, so that an answer that soon is seen
        when it comes (a sample the estimate can trust)."""
        now = time.perf_counter()
        expected = [shard.rung_at + shard.expected for shard in rung
                    if shard.expected is not None]
        soonest = min(expected) if expected else now
        near = soonest - now < _SPIN_WITHIN_S
        if probe or len(expected) < len(rung):
            until = max(now + _SPIN_WITHIN_S, soonest + _SPIN_MARGIN_S if near else now)
        elif not near:
            return False
        else:
            until = soonest + _SPIN_MARGIN_S
        while time.perf_counter() < until:
            for bell in bells:
                if bell.answered:
                    return True
        return False

    def _ring_recv(self, shard: _Shard) -> None:
        bell = _bell_stepper(shard).doorbell
        if bell is None or bell.closed:
            raise self._lost(shard, ConnectionLostError(
                "the daemon stopped serving the session's doorbell (the session was closed "
                "or expired, or the daemon stops)"))
        count = min(min(shard.remaining.values(), default=shard.in_flight), shard.in_flight)
        bell.ring(RECV, count)
        shard.rung = count
        shard.rung_at = time.perf_counter()

    def _check_alive(self, shard: _Shard, call: str) -> None:
        try:
            shard.channel.check_alive(f"envs in flight ({call})")
        except ConnectionLostError as exc:
            raise self._lost(shard, exc) from exc
        bell = _rung_bell(shard)
        if bell.closed and not bell.answered:
            raise self._lost(shard, ConnectionLostError(
                "the daemon stopped serving the session's doorbell (the session was closed "
                "or expired, or the daemon stops)"))

    def _take_answer(self, shard: _Shard) -> None:
        count, shard.rung = shard.rung, 0
        sent_ids, shard.sent_ids = shard.sent_ids, None
        bell = _rung_bell(shard)
        status, result, index = bell.answer()
        if sent_ids is not None and not bell.sent:
            self._take_refused_send(shard, sent_ids, status, result, index)
            return
        if status == SHUTTING_DOWN:
            raise self._lost(shard, ShuttingDownError(
                "the daemon is shutting down and takes no new work"))
        if status != 0:
            # an env failed in a batch: the next recv raises it, its envs stay
            # ready there for the RECV after it
            if self._failure is None:
                row = _bell_stepper(shard)._row_of(index, status)  # (the shard's own row)
                self._failure = self._named(
                    step_error(self._env_id, _bell_stepper(shard).action_space, status, row,
                               shard.env.buffers), shard)
            return
        if result != count:  # (a RECV answers exactly count ids)
            raise ProtocolError(f"{shard.where} answered a RECV of {count} envs with {result}")
        local = _bell_stepper(shard)._ids[:count].astype(np.int64)  # (a copy, int64 whatever the segment)
        run = self._check_answered_ids(shard, local)
        start = shard.rows.start
        if (len(shard.remaining) == 1
                and shard.remaining.get(int(self._batch_of[start + local[0]])) == count):
            shard.remaining.clear()  # (the common case: the one batch there, all of it)
        else:
            for serial, done in zip(*np.unique(self._batch_of[local + start],
                                               return_counts=True)):
                left = shard.remaining.get(int(serial), 0) - int(done)
                if left > 0:
                    shard.remaining[int(serial)] = left
                else:
                    shard.remaining.pop(int(serial), None)
        self._add_ready(shard, local, run)
        shard.in_flight -= count

    def _take_refused_send(self, shard: _Shard, ids: np.ndarray, status: int, state: int,
                           index: int) -> None:
        """A SENDRECV whose send the daemon refused: no env of it stepped, so
        they are idle again; the refusal is raised by the next call (as a
        posted send's over the socket), naming the daemon."""
        self._state[ids] = IDLE
        shard.in_flight -= len(ids)
        shard.remaining.pop(int(self._batch_of[ids[0]]), None)
        if status == SHUTTING_DOWN:  # (as a SEND refused so: the env is not lost)
            refusal: Exception | None = ShuttingDownError(
                "the daemon is shutting down and takes no new work")
        else:
            refusal = _bell_stepper(shard).send_refusal(status, state, index)
        if refusal is None:  # (the daemon said it was refused)
            refusal = ProtocolError(f"{shard.where} refused a send with status 0")
        if self._refusal is None:
            self._refusal = self._named(refusal, shard)

    def _forget(self) -> None:
        super()._forget()
        for shard in self._shards:
            if not shard.in_flight:
                shard.remaining = {}

    def async_reset(self, with_seeds: bool) -> None:
        # (the base waits while _waiting_anywhere; then every shard's reset
        # drops its envs in flight)
        super().async_reset(with_seeds)
        for shard in self._shards:
            shard.remaining = {}
