"""Waiting on several steppers' posted requests at once (the non-blocking
half, envd.stepping.PostingStepper): what a caller driving several daemons
(client/multi_async.py) sleeps on, by the kind of their waitables.

- Over the sockets (``SocketWaiter``): one zmq.Poller over every channel's
  socket and connection monitor; the trainer's CPU sleeps.
- Through the doorbells (``DoorbellWaiter``, where every stepper has the
  fast path): while an answer is expected within 60 us (each doorbell
  stepper's running estimate of how long after its ring an answer came), the
  trainer spins on the answer words: a sleeping trainer's wake-up costs it
  and the daemon tens of microseconds, about a cheap env's batch.  An answer
  seen only after a sleep looks later than it came (by the wake-up), which
  could keep the estimate above 60 us for good: so a stepper without an
  estimate, and every 16th wait, spin at least 60 us whatever it says, and
  an answer seen while spinning replaces the estimate (slept ones are
  averaged in).  Otherwise it sleeps on all of them at once (futex_waitv,
  client/doorbell.py ``wait_any``), in slices of 20 ms.  A daemon that did
  not answer has its liveness checked once a slice passed without any
  answer, and at least once a slice (a daemon that died is named then).  A
  doorbell found closed settles its ticket at once (the stepper's
  waitables: lost, or over the socket now); tickets over the socket (a
  doorbell gone) are slept on with a zmq.Poller, as by ``SocketWaiter``,
  never polled in a busy loop.

A waiter's ``wait`` returns which steppers to poll and which to check
alive; the caller does both (and names the daemon that is gone).
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

import zmq

from envd.client.doorbell import Doorbell, wait_any
from envd.client.transports.doorbell_stepper import DoorbellStepper
from envd.stepping import PostingStepper, Ticket

#: (the caller's index of a stepper, the stepper, its ticket waited for)
Pending = Sequence[tuple[int, PostingStepper, Ticket]]

#: longest sleep on the doorbells before the daemons' liveness is checked again
_SLICE_S = 0.02
#: longest sleep on the doorbells while tickets over a socket are pending too
#: (the sockets are looked at between the sleeps)
_MIXED_SLICE_S = 1e-3
#: spin (not sleep) while an answer is expected within this: a sleeping
#: trainer's wake-up costs it and the daemon that wakes it tens of
#: microseconds, as much as a cheap env's batch (docs/benchmarks.md)
_SPIN_WITHIN_S = 60e-6
#: spin up to this long past the expected answer (so at most
#: _SPIN_WITHIN_S + _SPIN_MARGIN_S in all; an answer overdue by more is
#: slept for)
_SPIN_MARGIN_S = 20e-6
#: every this many waits spin at least _SPIN_WITHIN_S whatever the estimates
#: say (a probe: an answer seen after a sleep includes the wake-up, so the
#: estimates only ever fall back below _SPIN_WITHIN_S through a spin)
_PROBE_EVERY = 16


class Waiter(Protocol):
    def wait(self, pending: Pending, seconds: float) -> tuple[list[int], list[int]]:
        """Sleep until some pending ticket may be done (or about seconds
        pass); (the indices of the steppers to poll, those to check alive)."""

    def close(self) -> None:
        """Let go of the waitables.  Idempotent."""


def waiter_for(steppers: Sequence[PostingStepper]) -> Waiter:
    """Through the doorbells where every stepper has the fast path, else
    over the sockets (the caller stops the doorbells then: a session the
    doorbell serves refuses socket sends and recvs)."""
    if steppers and all(isinstance(stepper, DoorbellStepper) and stepper.fast_path
                        for stepper in steppers):
        return DoorbellWaiter()
    return SocketWaiter()


class SocketWaiter:
    """One zmq.Poller over the steppers' sockets and monitors (registered
    as first seen)."""

    def __init__(self) -> None:
        self._poller = zmq.Poller()
        #: socket -> (the caller's index of its stepper, a connection monitor?)
        self._pollables: dict[zmq.Socket, tuple[int, bool]] = {}

    def wait(self, pending: Pending, seconds: float) -> tuple[list[int], list[int]]:
        for k, stepper, ticket in pending:
            for place, sock in enumerate(stepper.waitables(ticket)):
                if sock not in self._pollables:
                    self._poller.register(sock, zmq.POLLIN)
                    self._pollables[sock] = (k, place > 0)
        ready: list[int] = []
        check: list[int] = []
        for sock, _ in self._poller.poll(int(seconds * 1000)):  # (as pyzmq would)
            k, is_monitor = self._pollables[sock]
            (check if is_monitor else ready).append(k)
        return ready, check

    def close(self) -> None:
        for sock in self._pollables:
            self._poller.unregister(sock)
        self._pollables.clear()


class DoorbellWaiter:
    """Spin or sleep on the steppers' doorbells (see the module docstring)."""

    def __init__(self) -> None:
        self._waits = 0  # (every _PROBE_EVERY-th spins: _spin)
        self._checked_at: dict[int, float] = {}  # index -> its liveness last checked (monotonic)
        self._sockets = SocketWaiter()  # (tickets of steppers whose doorbell is gone)

    def wait(self, pending: Pending, seconds: float) -> tuple[list[int], list[int]]:
        rung: list[tuple[int, DoorbellStepper, Doorbell]] = []
        ready: list[int] = []
        over_sockets = []
        for k, stepper, ticket in pending:
            found = stepper.waitables(ticket)  # (rings a RECV waiting to be rung)
            if not found:  # done meanwhile (e.g. its doorbell closed): poll it
                ready.append(k)
            elif isinstance(found[0], Doorbell):
                assert isinstance(stepper, DoorbellStepper)  # (waiter_for)
                rung.append((k, stepper, found[0]))
            else:  # the daemon stopped serving the doorbell: the socket serves
                over_sockets.append((k, stepper, ticket))
        if ready:
            return ready, list(ready)
        if over_sockets:
            found_ready, found_check = self._sockets.wait(over_sockets, 0.0 if rung else seconds)
            if found_ready or found_check or not rung:
                return found_ready, found_check
            seconds = min(seconds, _MIXED_SLICE_S)
        bells = [bell for _, _, bell in rung]
        if not any(bell.answered for bell in bells):
            self._waits += 1
            seen = _spin(rung, probe=self._waits % _PROBE_EVERY == 0)
            if not seen:
                wait_any(bells, min(seconds, _SLICE_S))
            now = time.perf_counter()
            for _, stepper, bell in rung:  # (only a wait sees when an answer came)
                if bell.answered:
                    stepper.learn_answer_time(now - stepper.rung_at, exact=seen)
        any_answered = any(bell.answered for bell in bells)
        checked = time.monotonic()
        check: list[int] = []
        for k, _, bell in rung:
            if bell.answered:
                ready.append(k)
            elif not any_answered or checked - self._checked_at.get(k, 0.0) >= _SLICE_S:
                # (a daemon that answered is alive; one that did not is
                # checked once a slice passed without any answer, or every slice)
                self._checked_at[k] = checked
                check.append(k)
        return ready, check

    def close(self) -> None:
        self._sockets.close()


def _spin(rung: list[tuple[int, DoorbellStepper, Doorbell]], probe: bool = False) -> bool:
    """Spin on the rung doorbells while the soonest answer is expected
    within _SPIN_WITHIN_S: until one is answered (True), or _SPIN_MARGIN_S
    past it (False).  A probe, or a stepper without an estimate yet: at
    least _SPIN_WITHIN_S from now, so that an answer that soon is seen when
    it comes (a sample the estimate can trust)."""
    now = time.perf_counter()
    expected = [stepper.rung_at + stepper.expected for _, stepper, _ in rung
                if stepper.expected is not None]
    soonest = min(expected) if expected else now
    near = soonest - now < _SPIN_WITHIN_S
    if probe or len(expected) < len(rung):
        until = max(now + _SPIN_WITHIN_S, soonest + _SPIN_MARGIN_S if near else now)
    elif not near:
        return False
    else:
        until = soonest + _SPIN_MARGIN_S
    bells = [bell for _, _, bell in rung]
    while time.perf_counter() < until:
        for bell in bells:
            if bell.answered:
                return True
    return False
