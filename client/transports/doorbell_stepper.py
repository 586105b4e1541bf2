"""The same-host fast path: steps, sends and recvs through a doorbell in the
session's segment, answered by the daemon's native thread without a message
(envd.client.doorbell rings it).

Resets (async_reset too) and renders still go over the socket (they run on
the daemon's executor).  Once the daemon stops serving the doorbell (the
session was closed or expired, or the daemon stops) every call goes over the
socket, whose reply says which.  The books are the daemon's native
session's, as over the socket.

A doorbell takes one request at a time: the one rung and not answered yet
(``_rung``: its kind and tickets) is waited for before the next ring, or
before a request over the socket.  Every call is posted (a ticket the
answer finishes, in one place: ``_take_answer``); the blocking step and recv
are a post and a ``wait`` (Doorbell.wait: spin, yield, futex sleep), and a
blocking send is a post only: it rings SEND and returns without waiting for
the answer (the daemon answers once it started the batch; a trainer's
learner overlaps that, and it measured 10 us a batch).  The next call reads
that answer first: a refusal (an env not idle, ...) is raised by the next
send, recv, step or render, before it asks anything, with the in-process
message; a reset or async_reset forgets it, as over the socket.  A request
the doorbell closed on without an answer goes over the socket (which
answers it, or says why), but a posted recv (its batch went with the
doorbell: ConnectionLostError).  An answer no daemon could give (a RECV
answered with another count) fails its ticket and every later call with
the same ProtocolError.

The non-blocking half as several daemons' async MultiVecEnv drives it
(client/multi_async.py):

- ``post_send``: where the envs are all the session's (EnvPool's loop with a
  batch per daemon), a SENDRECV: the send and the recv of them all,
  answered once, when the batch finished; the trainer goes on at once, and
  the daemon's thread (asleep on a small machine while the trainer serves
  the other daemons) is woken once per batch instead of twice.  Its refusal
  finishes the send's ticket.  Any other envs: a SEND, as a blocking send's
  (no SENDRECV there, as a send before its answer would wait for it);
- ``post_recv``: the recv a SENDRECV rang, or a RECV rung only once a
  caller waits for it (``waitables`` or ``wait``), of the smallest batch still
  in flight (so any batch that finishes answers it; the daemon keeps the
  rest of a larger one ready for the next RECV): the doorbell stays free for
  sends until then.  The batches posted are this stepper's only books (the
  blocking calls keep none: their recv asks its exact count).
"""
from __future__ import annotations

import mmap
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from envd.client.doorbell import RECV, SEND, SENDRECV, SHUTTING_DOWN, STEP, Doorbell
from envd.client.transports.over_socket import NO_IDS, SocketStepper
from envd.errors import NATIVE_CODES, ConnectionLostError, EnvdTimeoutError, EnvError, ProtocolError, ShuttingDownError
from envd.stepping import Ticket
from envd.vec_errors import in_flight_error, not_idle_error, ready_error, recv_short_error, send_error, step_error

_ENV_IDLE, _ENV_IN_FLIGHT = 0, 1  # a refused send's env state (native/src/session.h)
#: weight of the latest answer in the running estimate (learn_answer_time)
_EXPECTED_WEIGHT = 0.25
_DOORBELL_GONE = ("the daemon stopped serving the session's doorbell (the session was closed "
                  "or expired, or the daemon stops)")


class DoorbellStepper(SocketStepper):
    """SocketStepper whose steps, sends and recvs ring the doorbell at
    ``offset`` in the mapped segment ``memory``."""

    def __init__(self, *args: Any, memory: mmap.mmap, offset: int, **kwargs: Any):
        super().__init__(*args, **kwargs)
        #: None once the daemon closed it (then the socket serves)
        self.doorbell: Doorbell | None = Doorbell(memory, offset)
        self._ids = self.buffers["doorbell_ids"]
        #: the request rung and not answered yet: (its kind, its ticket, a
        #: SENDRECV's recv ticket or None); never set without a doorbell
        self._rung: tuple[int, Ticket, Ticket | None] | None = None
        #: a recv posted but not rung yet (wait or waitables rings it)
        self._unrung: Ticket | None = None
        #: an answer no daemon could give: every call raises it from then on
        self._broken: ProtocolError | None = None
        #: batches posted (post_send) in flight: serial -> its envs not received yet
        self._remaining: dict[int, int] = {}
        self._batch_of = np.zeros(self.num_envs, np.int64)  # each env's last batch serial
        self._serial = 0
        #: when the request out there was rung (perf_counter), and how long
        #: after its ring an answer came as seen by a wait for it (an
        #: estimate, None until a wait saw one): client/transports/waiting.py
        self.rung_at = 0.0
        self.expected: float | None = None

    @property
    def fast_path(self) -> bool:
        return self.doorbell is not None

    def learn_answer_time(self, took: float, exact: bool) -> None:
        """Fold an answer that came `took` after its ring into ``expected``
        (a waiter on several doorbells: client/transports/waiting.py).  One
        seen while spinning is exact and replaces it; one seen after a
        sleep includes the wake-up and is averaged in (so a probe's exact
        sample brings an estimate that slept samples held above the spin
        window back at once)."""
        if exact or self.expected is None:
            self.expected = took
        else:
            self.expected += (took - self.expected) * _EXPECTED_WEIGHT

    def stop_fast_path(self) -> None:
        """Ask the daemon to stop serving the doorbell: every call goes over
        the socket from now on (which a session the doorbell serves refuses
        for sends and recvs)."""
        if self.doorbell is not None:
            self._call({"type": "fast", "session": self.session, "enable": False})
            self.doorbell = None

    def check_buffers_free(self, deadline: float | None = None) -> None:
        """(A late fast-path step's answer is taken in first; a doorbell
        closed without answering it hands the step to the socket, whose
        reply or monitor says what became of it.)"""
        rung = self._rung
        if self.maybe_running and rung is not None and rung[0] == STEP:
            self.poll(rung[1])
        super().check_buffers_free(deadline)

    def _answer_pending(self, ticket: Ticket) -> bool:
        rung = self._rung
        if rung is not None and (ticket is rung[1] or ticket is rung[2]):
            return True  # (the doorbell answers it, or the socket once it closed)
        return super()._answer_pending(ticket)

    def async_reset(self, with_seeds: bool) -> None:
        """(The daemon drops the batches in flight, and so do the books.)"""
        super().async_reset(with_seeds)
        self._remaining.clear()
        self._unrung = None

    # ---- the non-blocking half (see the module docstring) --------------------------------
    def post_step(self) -> Ticket:
        bell = self._bell()
        if bell is None:
            return super().post_step()
        ticket = Ticket("step")
        bell.ring(STEP, 0)
        self._rung = (STEP, ticket, None)
        return ticket

    def post_send(self, env_ids: np.ndarray) -> Ticket:
        bell = self._bell()
        if bell is None:
            return super().post_send(env_ids)  # (the socket says why)
        count = len(env_ids)
        self._serial += 1
        self._remaining[self._serial] = count
        if count < self.num_envs:
            self._batch_of[env_ids] = self._serial
            return self._post_send(env_ids, self._serial)
        self._ids[:count] = env_ids
        ticket = Ticket("send")
        ticket.wire = (env_ids, self._serial)
        received = Ticket("recv")
        received.wire = (count, False)
        bell.ring(SENDRECV, count)
        self.rung_at = time.perf_counter()
        # (its envs' batch is marked only if a RECV must count them: _take_answer)
        self._rung = (SENDRECV, ticket, received)
        return ticket

    def post_recv(self, count: int, exact: bool = False) -> Ticket:
        rung = self._rung
        if not exact and rung is not None and rung[2] is not None:
            return rung[2]  # (the SENDRECV's)
        if self._broken is not None:
            raise self._broken
        if self.doorbell is None:
            return super().post_recv(count, exact)  # (stopped: the socket serves)
        ticket = Ticket("recv", posted=False)
        ticket.wire = (count, exact)
        if exact:  # (the blocking recv's: waited for at once)
            self._ring_recv(ticket)
        else:
            self._unrung = ticket
        return ticket

    def poll(self, ticket: Ticket) -> bool:
        if self._broken is not None:
            raise self._broken
        if self._rung is not None:
            bell = self.doorbell
            assert bell is not None  # (_rung)
            if bell.answered:
                self._take_answer(bell.answer())
            elif bell.closed:  # (it answers before it closes: read answered again)
                self._take_answer(bell.answer() if bell.answered else None)
        return super().poll(ticket) if self._tickets_out else ticket.done

    def wait(self, ticket: Ticket, deadline: float | None = None) -> None:
        """Ring the recv if it waits to be rung, then wait for the doorbell's
        answer (Doorbell.wait), or for the socket's reply (not past
        deadline: see PostingStepper.wait)."""
        if ticket is self._unrung:
            self._ring_recv(ticket)
        rung = self._rung
        if rung is not None and (ticket is rung[1] or ticket is rung[2]):
            self._await_rung(deadline)
        elif self._broken is not None:  # (nothing is rung once it is)
            raise self._broken
        if not ticket.done:  # (over the socket)
            super().wait(ticket, deadline)

    def waitables(self, ticket: Ticket) -> tuple[Any, ...]:
        """The doorbell a caller sleeps on (client/doorbell.py wait_any),
        ringing the recv's RECV first if it waits to be rung; none once the
        ticket is done (a doorbell found closed settles it at once); the
        socket's once the socket serves it."""
        if self._broken is not None:
            raise self._broken
        if ticket is self._unrung:
            self._ring_recv(ticket)
        rung = self._rung
        if rung is not None and (ticket is rung[1] or ticket is rung[2]):
            bell = self.doorbell
            assert bell is not None  # (_rung)
            if not bell.closed:
                return (bell,)
            self.poll(ticket)  # (answered, or a posted recv lost, or over the socket now)
        return () if ticket.done else super().waitables(ticket)

    # ---- the doorbell's one request ------------------------------------------------------
    def _bell(self) -> Doorbell | None:
        """The doorbell, free (the request rung is answered first), or None
        once the daemon closed it (the socket serves then)."""
        bell = self.doorbell
        if self._rung is None and bell is not None and self._broken is None and not bell.closed:
            return bell  # (the hot path)
        if self._broken is not None:
            raise self._broken
        if self._rung is not None:
            self._await_rung()
            bell = self.doorbell
        if bell is not None and bell.closed:
            self.doorbell = bell = None
        return bell

    def _post_send(self, env_ids: np.ndarray, serial: int = 0) -> Ticket:
        """A SEND of env_ids (serial: post_send's batch, 0 for the blocking
        send's, which keeps no books), answered by the next call."""
        bell = self._bell()
        if bell is None:
            return super()._post_send(env_ids)
        count = len(env_ids)
        self._ids[:count] = env_ids
        ticket = Ticket("send")
        ticket.wire = (env_ids, serial)
        bell.ring(SEND, count)
        self._rung = (SEND, ticket, None)
        return ticket

    def _ring_recv(self, ticket: Ticket) -> None:
        """Ring a recv posted (its count: a posted one's, the smallest batch
        in flight; an exact one's as asked)."""
        if ticket is self._unrung:
            self._unrung = None
        count, exact = ticket.wire
        bell = self._bell()
        if bell is None:
            if exact:
                self._post_ticket(ticket, *self._request_recv(count))
            else:  # (its batch went with the doorbell)
                ticket.finish(NO_IDS, ConnectionLostError(_DOORBELL_GONE), lost=True)
            return
        if not exact:
            count = min(min(self._remaining.values(), default=count), count)
        bell.ring(RECV, count)
        self.rung_at = time.perf_counter()
        ticket.posted = True
        ticket.wire = (count, exact)
        self._rung = (RECV, ticket, None)

    def _await_rung(self, deadline: float | None = None) -> None:
        """Wait for the answer to the request rung (Doorbell.wait: the spin,
        the yield and the futex sleep tuned per kind), at most the client's
        timeout and not past deadline (time.monotonic()) if given, and take
        it in (an answer in is taken even past deadline)."""
        assert self._rung is not None and self.doorbell is not None
        _, ticket, _ = self._rung
        answer = self.doorbell.quick_answer()  # (a cheap env's whole step at N=64)
        if answer is not None:
            self._take_answer(answer)
            return
        end = time.monotonic() + self.channel.timeout
        if deadline is not None and deadline < end:
            end = deadline
        try:
            answer = self.doorbell.wait(end, self.channel.check_alive)
        except TimeoutError:
            error = EnvdTimeoutError(
                f"no answer to a fast-path {ticket.kind} from the daemon at "
                f"{self.channel.endpoint} within {self.channel.timeout:g} s (Client timeout)")
            self.give_up(ticket, error)  # (a step: until the answer comes)
            raise error from None
        except BaseException as exc:  # (an interrupt: Ctrl-C; the daemon gone)
            self.give_up(ticket, exc)  # (the request stays rung: its answer is read later)
            raise
        self._take_answer(answer)

    def _take_answer(self, answer: tuple[int, int, int] | None) -> None:
        """The rung request's answer into its tickets (the one place the
        doorbell's answers are read); None: the daemon closed the doorbell
        without answering (the socket serves from now on)."""
        rung, self._rung = self._rung, None
        assert rung is not None
        kind, ticket, received = rung
        if answer is None:
            self.doorbell = None
            self._unanswered(kind, ticket, received)
            return
        status, result, index = answer
        if kind == STEP:
            if status == 0:  # (the hot path: nothing to map or raise)
                ticket.done, ticket.result = True, result
            else:
                ticket.finish(error=self._step_refusal(status, result, index))
        elif kind == SEND:
            if status == 0:  # (the hot path: started)
                ticket.done = True
                return
            refusal = self._send_refusal(status, result, index)
            if refusal is not None:  # none of its envs stepped
                self._remaining.pop(ticket.wire[1], None)
            ticket.finish(error=refusal)
        elif kind == SENDRECV:
            assert received is not None
            self._take_sendrecv(ticket, received, status, result, index)
        else:
            self._take_recv(ticket, status, result, index)

    def _take_sendrecv(self, sent: Ticket, received: Ticket, status: int, result: int,
                       index: int) -> None:
        bell = self.doorbell
        assert bell is not None  # (rung on it)
        serial = sent.wire[1]
        if not bell.sent:  # refused: none of its envs stepped
            self._remaining.pop(serial, None)
            refusal = self._send_refusal(status, result, index)
            if refusal is None:  # (the daemon said it was refused)
                refusal = ProtocolError(f"the daemon at {self.channel.endpoint} refused a "
                                        "send with status 0")
            sent.finish(error=refusal)
            received.finish(NO_IDS)
            return
        sent.finish()
        count = self.num_envs
        if status == 0 and result == count:  # (the common case: all of them back)
            self._remaining.pop(serial, None)
            received.finish(self._ids[:count].astype(np.int64))
            return
        self._batch_of[:] = serial  # (the batch: RECVs will count its envs)
        self._take_recv(received, status, result, index)

    def _take_recv(self, ticket: Ticket, status: int, result: int, index: int) -> None:
        count, exact = ticket.wire
        if status == 0 and result == count:  # (the hot path)
            ids = self._ids[:count].astype(np.int64)  # (a copy, int64 whatever the segment)
            if not exact:
                self._count_received(ids)
            ticket.done, ticket.ids = True, ids
        elif status == SHUTTING_DOWN:
            ticket.finish(NO_IDS, ShuttingDownError(
                "the daemon is shutting down and takes no new work"), lost=True)
        elif status == NATIVE_CODES["ESTATE"] and index < 0:  # fewer in flight or ready
            ticket.finish(NO_IDS, recv_short_error(self.env_id, count, result))
        elif status != 0:
            # an env failed in a batch: its envs stay ready there for the recv after it
            index = self._row_of(index, status)
            ticket.finish(NO_IDS, self._env_failure(status, index) or step_error(
                self.env_id, self.action_space, status, index, self.buffers))
        else:  # (a RECV answers exactly count ids)
            self._broken = ProtocolError(f"the daemon at {self.channel.endpoint} answered a "
                                         f"RECV of {count} envs with {result}")
            ticket.finish(NO_IDS, self._broken)

    def _unanswered(self, kind: int, ticket: Ticket, received: Ticket | None) -> None:
        """The daemon closed the doorbell without answering the request
        rung: the socket serves it (and says why), but a posted recv, whose
        batch went with the doorbell."""
        if kind == STEP:
            self._post_ticket(ticket, *self._request_step())
        elif kind == SEND:
            self._post_ticket(ticket, *self._request_send(ticket.wire[0]))
        elif received is not None:  # (a SENDRECV: whether its send stepped is unknown)
            ticket.finish()
            received.finish(NO_IDS, ConnectionLostError(_DOORBELL_GONE), lost=True)
        elif ticket.wire[1]:  # (an exact recv)
            self._post_ticket(ticket, *self._request_recv(ticket.wire[0]))
        else:
            ticket.finish(NO_IDS, ConnectionLostError(_DOORBELL_GONE), lost=True)

    def _raise_refusal(self) -> None:
        if self._rung is not None:
            self._await_rung()  # (a blocking send's answer, before this call asks anything)
        SocketStepper._raise_refusal(self)

    def _call(self, header: dict[str, Any], blobs: Sequence = ()) -> dict[str, Any]:
        if self._rung is not None and self._broken is None:
            self._await_rung()  # (a reset's or render's request after the send's answer)
        return super()._call(header, blobs)

    # ---- the books of posted batches --------------------------------------------------------
    def _count_received(self, ids: np.ndarray) -> None:
        """Take received envs off their batches' counts (ids out of range
        are left to the caller's books to refuse)."""
        remaining = self._remaining
        first = int(ids[0]) if len(ids) else -1
        if (len(remaining) == 1 and 0 <= first < self.num_envs
                and remaining.get(int(self._batch_of[first])) == len(ids)):
            remaining.clear()  # (the common case: the one batch there, all of it)
            return
        if not len(ids) or ids.view(np.uint64).max() >= self.num_envs:
            return
        for serial, done in zip(*np.unique(self._batch_of[ids], return_counts=True)):
            left = remaining.get(int(serial), 0) - int(done)
            if left > 0:
                remaining[int(serial)] = left
            else:
                remaining.pop(int(serial), None)

    # ---- the answers' errors, as in-process ---------------------------------------------------
    def _step_refusal(self, status: int, result: int, index: int) -> Exception:
        """The error of a step the doorbell answered with status (not 0)."""
        if status == SHUTTING_DOWN:
            return ShuttingDownError("the daemon is shutting down and takes no new work")
        if status == NATIVE_CODES["EBUSY"] and index < 0:  # envs out: which (doorbell.h)
            if result > 0:
                return in_flight_error(self.env_id, "step", result)
            return ready_error(self.env_id, -result)
        index = self._row_of(index, status)
        return self._env_failure(status, index) or step_error(
            self.env_id, self.action_space, status, index, self.buffers)

    def _send_refusal(self, status: int, state: int, index: int) -> Exception | None:
        """The error of a send the doorbell answered (status, env state,
        error index), as in-process; None if it was not refused."""
        if status == SHUTTING_DOWN:
            return ShuttingDownError("the daemon is shutting down and takes no new work")
        if status == NATIVE_CODES["EBUSY"] and 0 <= index < self.num_envs and state != _ENV_IDLE:
            return not_idle_error(self.env_id, index, state == _ENV_IN_FLIGHT)  # (an env id)
        index = self._row_of(index, status)
        failure = self._env_failure(status, index)
        if failure is not None:
            return failure
        if status != 0:
            return send_error(self.env_id, self.action_space, self.num_envs, status, index,
                              self.buffers)
        return None

    def _row_of(self, env: int, status: int) -> int:
        """The row an answer's failure or refusal names, as the in-process
        vec and the socket path name it (NativeSession._refused_env_error): the
        doorbell names envs; a multi-agent env's refused action is its first
        agent's row outside the space, any other error (ESTATE, EENV) the
        env's first row.  Other statuses (EBUSY, EINVAL: env ids) and -1
        stay as they are.  The one place the fast path maps them."""
        mapped = (NATIVE_CODES["ERANGE"], NATIVE_CODES["ESTATE"], NATIVE_CODES["EENV"])
        if self.num_agents == 1 or status not in mapped or not 0 <= env < self.num_envs:
            return env
        rows = range(env * self.num_agents, (env + 1) * self.num_agents)
        if status == NATIVE_CODES["ERANGE"]:
            actions = self.buffers["actions"]
            for row in rows:
                if not self.action_space.contains(actions[row]):
                    return row
        return rows[0]

    def _env_failure(self, status: int, index: int) -> EnvError | None:
        """An env's own failure the daemon words (a hosted Python env raised,
        or its worker died: the doorbell's message) is the EnvError the
        socket path raises; without words, step_error's NativeError is."""
        if status == NATIVE_CODES["EENV"]:
            message = self.doorbell.message() if self.doorbell is not None else ""
            if message:
                return EnvError(f"{self.env_id}: {message}", status, index)
        return None
