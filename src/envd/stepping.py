"""The Stepper protocol: what a BatchedVecEnv steps through.

A ``BatchedVecEnv`` (envd.vector_base) checks what needs no state (shapes,
dtypes, action conversion, env-id range and repeats), writes a call's inputs
into its buffers, calls its stepper, and reads the outputs from the buffers
after it.  The stepper runs the envs and keeps the async books, once:

- in-process, ``envd.native.native_session.NativeSession`` (the native
  session: its books live in C);
- for a daemon-served env, the client's transports (shm over the socket,
  inline, doorbell), each of which asks the daemon's native session.

One stepper per env, called from one thread at a time, under the env's lock.
Inputs are in the env's buffers before each call: ``actions`` (every row for
``step``; the rows of ``env_ids`` for ``send``), ``reset_seeds`` and
``reset_mask``.  Errors are envd errors (envd.errors) with the messages of
envd.vec_errors (e.g. ``in_flight_error``), the same whichever stepper
raised them.

Async books (EnvPool's rules): each env is IDLE (the trainer holds it: it may
be sent), IN_FLIGHT (being stepped) or READY (stepped, waiting for recv).
Ready envs queue in the order their batches were found finished (batches
checked in submit order); the first failure of an env in a finished batch is
raised by the next recv, whose envs stay ready for the recv after it.

The non-blocking half (``PostingStepper``, a daemon session's transports):
post a step, a send or a recv and get a ``Ticket``; ``poll`` takes in the
answers that came (never waiting) and says whether a ticket is done;
``wait`` blocks until one is (the transport's own tuned wait: the zmq poll
of the socket, the doorbell's spin, yield and futex sleep), until a
deadline if given (a caller waiting for several tickets in turn gives each
the same one, so that the client's timeout bounds the whole call); ``waitables``
names what a caller driving several steppers sleeps on (zmq sockets or
doorbells: client/transports/waiting.py waits on several at once).  It
keeps no books of its own beyond what its wire needs: the caller (the
multi-daemon client, client/multi_async.py, sync and async) keeps the async
books across steppers and takes each ticket in once.  The transports' blocking calls are
that half's post then wait: each request's wire and answer exist once.
"""
from __future__ import annotations

from typing import Any, NoReturn, Protocol, runtime_checkable

import numpy as np

from envd.errors import EnvStateError


@runtime_checkable
class Stepper(Protocol):
    """Runs the envs of one BatchedVecEnv and keeps its async books."""

    def reset(self, with_seeds: bool, with_mask: bool) -> None:
        """Reset every env (or those in reset_mask when with_mask), reseeding
        from reset_seeds first when with_seeds.  Refused while envs are in
        flight; forgets the ready ones (and a failure not reported yet)."""

    def async_reset(self, with_seeds: bool) -> None:
        """Wait for the envs in flight and drop their results, reset every
        env, and make them all READY in env order."""

    def step(self) -> int:
        """Step every env with the actions buffer; the number of episodes
        that ended.  Refused while envs are in flight or ready."""

    def send(self, env_ids: np.ndarray) -> None:
        """Start stepping env_ids (int64, each IDLE, no repeats) with their
        rows of the actions buffer; returns without waiting for them."""

    def recv(self, count: int) -> np.ndarray:
        """Block until count envs are ready and return exactly the count
        oldest ready ids (int64, ready order); the rest stay ready.  Refused
        when fewer than count are in flight or ready."""

    def render(self, out: np.ndarray) -> None:
        """Draw every env's frame into out ((num_envs, h, w, 3) uint8).
        Refused while envs are in flight or ready
        (not received: whether a sent env finished by now depends on the threads)."""

    def close(self) -> None:
        """Wait for what is in flight, free everything.  Idempotent."""


class Ticket:
    """One posted request of a PostingStepper, done once its answer was
    taken in (by ``poll`` or ``wait``, or by a later post that had to read
    it first).

    A step's answer: ``result``, the number of episodes that ended, or
    ``error``.  A send's: ``error`` None (its envs are stepping), or the refusal
    (none of them stepped: they are idle again).  A recv's: ``ids``, the
    local ids of the envs it received (int64, the daemon's ready order; their
    output rows are in the stepper's buffers), or ``error``: an env failed in
    a batch (its batch's envs come with a later recv), or the session or
    daemon is gone (``lost``).  ``posted``: the request is out at the daemon
    (a doorbell's recv is rung only once a caller waits for it)."""

    # (class-level defaults, no __slots__: a ticket per blocking call is made
    # with one store, and an answer sets only what it says)
    done = False
    posted = True
    ids: np.ndarray | None = None
    error: BaseException | None = None
    lost = False
    result = 0
    #: the transport's own state of the request (never read by a caller)
    wire: Any = None

    def __init__(self, kind: str, posted: bool = True):
        self.kind = kind
        if not posted:
            self.posted = False

    def finish(self, ids: np.ndarray | None = None, error: BaseException | None = None,
               lost: bool = False, result: int = 0) -> None:
        """Record the answer (the transport's side)."""
        self.done, self.ids, self.error, self.lost, self.result = True, ids, error, lost, result


@runtime_checkable
class PostingStepper(Stepper, Protocol):
    """A Stepper with a non-blocking half (see the module docstring)."""

    #: a request timed out, or a wait for a step's answer ended by any
    #: other exception (KeyboardInterrupt) while that answer could still
    #: come: the daemon may still use the buffers until its late answer
    #: says it ended (check_buffers_free); give_up sets it too
    maybe_running: bool

    def check_buffers_free(self, deadline: float | None = None) -> None:
        """Raise EnvStateError while a request that timed out or was
        interrupted may still use the buffers (taking in a late answer that
        says it ended first; after an interrupted step, waiting for it at
        most the client's timeout, not past deadline), ConnectionLostError
        if the daemon is gone meanwhile."""

    def give_up(self, ticket: Ticket, error: BaseException) -> None:
        """A caller stops waiting for ticket (posted, not done) because of
        error: a step whose answer can still come sets maybe_running (not
        one whose answer was read already; not the daemon gone)."""

    def post_step(self) -> Ticket:
        """Step every env with the actions buffer (its ``result``: the
        episodes that ended)."""

    def post_send(self, env_ids: np.ndarray) -> Ticket:
        """Start stepping env_ids (int64, each idle, no repeats) with their
        rows of the actions buffer; never waits for the envs."""

    def post_recv(self, count: int, exact: bool = False) -> Ticket:
        """Receive the envs of the next batch(es) to finish here (at least
        one, at most count: the envs sent and not received yet); exact:
        exactly count, the oldest ready (the blocking recv's)."""

    def poll(self, ticket: Ticket) -> bool:
        """Take in the answers that came (never waiting); ticket.done."""

    def wait(self, ticket: Ticket, deadline: float | None = None) -> None:
        """Block until ticket is done, at most until deadline
        (time.monotonic() seconds; None: the client's timeout from now) and
        never past the client's timeout from now: EnvdTimeoutError, naming
        that timeout; its own error is left in it.  An answer that came is
        taken in even once deadline passed.  A step's wait that raises
        (a timeout, an interrupt; not the daemon gone) leaves
        maybe_running set."""

    def waitables(self, ticket: Ticket) -> tuple[Any, ...]:
        """What a caller about to wait for ticket sleeps on (posting a
        request that waits to be posted first)."""

    def check_alive(self, waiting_for: str) -> None:
        """Raise ConnectionLostError if the daemon or its session is gone."""

    def rows_of(self, env_ids: np.ndarray) -> np.ndarray:
        """The buffer rows of envs env_ids, in their order (a multi-agent
        env's agents, agent-major)."""


class _NoStepper:
    """The stepper of a VecEnv that has none: before its subclass set its
    own, and once closed (which drops it).  BatchedVecEnv._acquire() refuses
    a closed env before any call gets here, so the VecEnv's step, send and
    recv read a Stepper, never an Optional, at no cost per call."""

    def _refuse(self) -> NoReturn:
        raise EnvStateError("this VecEnv has no envs to step (closed, or its making failed)")

    def reset(self, with_seeds: bool, with_mask: bool) -> None:
        self._refuse()

    def async_reset(self, with_seeds: bool) -> None:
        self._refuse()

    def step(self) -> int:
        self._refuse()

    def send(self, env_ids: np.ndarray) -> None:
        self._refuse()

    def recv(self, count: int) -> np.ndarray:
        self._refuse()

    def render(self, out: np.ndarray) -> None:
        self._refuse()

    def close(self) -> None:
        """Nothing to free."""


#: the one _NoStepper
NO_STEPPER: Stepper = _NoStepper()
