"""The same-host fast path: steps, sends and recvs through a doorbell in the
session's segment, answered by the daemon's native thread without a message
(envd.client.doorbell rings it).

Resets (async_reset too) and renders still go over the socket (they run on
the daemon's executor).  Once the daemon stops serving the doorbell (the
session was closed or expired, or the daemon stops) every call goes over the
socket, whose reply says which.  The books are the daemon's native
session's, as over the socket.

A send is posted, as over the socket: it rings SEND and returns without
waiting for the answer (the daemon answers once it started the batch; a
trainer's learner overlaps that, and it measured 10 us a batch).  The next
call that uses the session first reads that answer (a doorbell takes one
request at a time): a refusal (an env not idle, ...) is raised by the next
send, recv, step or render, before it asks anything, with the in-process
message; a reset or async_reset forgets it, as over the socket.

The non-blocking half (envd.stepping.PostingStepper, what several daemons'
async MultiVecEnv drives, client/multi_async.py):

- ``post_send``: where the envs are all the session's (EnvPool's loop with a
  batch per daemon), a SENDRECV: the send and the recv of them all,
  answered once, when the batch finished; the trainer goes on at once, and
  the daemon's thread (asleep on a small machine while the trainer serves
  the other daemons) is woken once per batch instead of twice.  Its refusal
  finishes the send's ticket.  Any other envs: a SEND, answered at once
  (its ticket is done when post_send returns); no SENDRECV there, as a send
  before its answer would wait for it.  A request still out on the doorbell
  is waited for first (a doorbell takes one request at a time);
- ``post_recv``: the recv a SENDRECV rang, or a RECV rung only once a
  caller waits for it (``waitables``), of the smallest batch still in flight
  (so any batch that finishes answers it; the daemon keeps the rest of a
  larger one ready for the next RECV): the doorbell stays free for sends
  until then.  The batches are this stepper's only books.
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
        #: the env ids of a posted SEND whose answer was not read yet
        self._posted: np.ndarray | None = None
        # ---- the non-blocking half's books
        #: the ticket a SENDRECV or RECV rung and not answered yet answers
        #: (the send's, None for a RECV; and the recv's)
        self._rung: tuple[Ticket | None, Ticket] | None = None
        #: a recv posted but not rung yet (waitables rings it)
        self._unrung: Ticket | None = None
        #: batches in flight: serial -> its envs not received yet
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

    def stop_fast_path(self) -> None:
        """Ask the daemon to stop serving the doorbell: every call goes over
        the socket from now on (which a session the doorbell serves refuses
        for sends and recvs)."""
        if self.doorbell is not None:
            self._call({"type": "fast", "session": self.session, "enable": False})
            self.doorbell = None

    def check_buffers_free(self) -> None:
        if self.maybe_running and self.doorbell is not None and self.doorbell.answered:
            self.maybe_running = False  # the late fast-path step has ended
        super().check_buffers_free()

    def step(self) -> int:
        """SocketStepper.step, straight to the ring when no send is posted
        and no refusal or late reply waits to be read (its _raise_refusal
        would find nothing): a trainer's hot call, where a cheap env's step
        through the daemon costs a few microseconds and each call layer a
        tenth of one."""
        if self._posted is None and self._refusal is None and not self.sends_unanswered:
            return self._step()
        return super().step()

    def send(self, env_ids: np.ndarray) -> None:
        """Post the send (see the module docstring)."""
        self._check_async_state()
        self._raise_refusal()  # (reads a send posted before this one)
        bell = self.doorbell
        if bell is None or bell.closed:
            self._send(env_ids)  # (the socket: posted there too)
            return
        self._ids[:len(env_ids)] = env_ids
        bell.ring(SEND, len(env_ids))
        self._posted = env_ids

    def _raise_refusal(self) -> None:
        self._read_posted()
        super()._raise_refusal()

    # ---- the non-blocking half (see the module docstring) --------------------------------
    def post_send(self, env_ids: np.ndarray) -> Ticket:
        bell = self.doorbell
        if bell is None or bell.closed:
            return super().post_send(env_ids)  # (the socket says why)
        if self._rung is not None:
            self._settle("send")
        count = len(env_ids)
        self._ids[:count] = env_ids
        ticket = Ticket("send")
        if count == self.num_envs:
            bell.ring(SENDRECV, count)
            self.rung_at = time.perf_counter()
            self._rung = (ticket, Ticket("recv"))
            # (its envs' batch is marked only if a RECV must count them: _take_answer)
            self._serial += 1
            self._remaining[self._serial] = count
            ticket.wire = self._serial
            return ticket
        bell.ring(SEND, count)
        answer = self._await(bell, SEND, "send")
        if answer is None:  # closed before it answered: the socket sends it, or says why
            return super().post_send(env_ids)
        refusal = self.send_refusal(*answer)
        if refusal is None:
            self._add_batch(env_ids)
        ticket.finish(error=refusal)
        return ticket

    def post_recv(self, in_flight: int) -> Ticket:
        if self.doorbell is None:
            return super().post_recv(in_flight)  # (stopped: the socket serves)
        if self._rung is not None and not self._rung[1].done and self._rung[0] is not None:
            return self._rung[1]  # (the SENDRECV's)
        ticket = Ticket("recv", posted=False)
        ticket.wire = in_flight
        self._unrung = ticket
        return ticket

    def poll(self, ticket: Ticket) -> bool:
        rung = self._rung
        if rung is not None and self.doorbell is not None and self.doorbell.answered:
            self._take_answer()
        return super().poll(ticket) if self._tickets_out else ticket.done

    def waitables(self, ticket: Ticket) -> tuple[Any, ...]:
        """The doorbell a caller sleeps on (client/doorbell.py wait_any),
        ringing the recv's RECV first if it waits to be rung."""
        if self.doorbell is None:
            return super().waitables(ticket)  # (stopped: the socket serves)
        if ticket.done:
            return ()
        if ticket is self._unrung:
            self._ring_recv(ticket)
        return () if ticket.done else (self.doorbell,)

    def check_alive(self, waiting_for: str) -> None:
        super().check_alive(waiting_for)
        bell = self.doorbell
        if self._rung is not None and bell is not None and bell.closed and not bell.answered:
            raise ConnectionLostError(_DOORBELL_GONE)

    def async_reset(self, with_seeds: bool) -> None:
        """(The caller waited for every request rung: the daemon drops the
        batches in flight, and so do the books.)"""
        super().async_reset(with_seeds)
        self._remaining.clear()
        self._rung = self._unrung = None

    def _add_batch(self, env_ids: np.ndarray) -> None:
        self._serial += 1
        self._batch_of[env_ids] = self._serial
        self._remaining[self._serial] = len(env_ids)

    def _settle(self, call: str) -> None:
        """Wait for the answer of the request rung (it answers its tickets)."""
        bell = self.doorbell
        assert bell is not None  # (rung on it: dropped only once answered)
        if self._await(bell, RECV, call) is not None or bell.answered:
            self._take_answer()
        else:
            raise ConnectionLostError(_DOORBELL_GONE)

    def _ring_recv(self, ticket: Ticket) -> None:
        self._unrung = None
        bell = self.doorbell
        if bell is None or bell.closed:
            ticket.finish(NO_IDS, ConnectionLostError(_DOORBELL_GONE), lost=True)
            return
        count = min(min(self._remaining.values(), default=ticket.wire), ticket.wire)
        bell.ring(RECV, count)
        self.rung_at = time.perf_counter()
        ticket.posted = True
        ticket.wire = count
        self._rung = (None, ticket)

    def _take_answer(self) -> None:
        """The rung request's answer (it is in) into its tickets."""
        rung, self._rung = self._rung, None
        assert rung is not None and self.doorbell is not None
        sent, received = rung
        bell = self.doorbell
        status, result, index = bell.answer()
        if sent is not None:
            if not bell.sent:  # refused: none of its envs stepped
                self._remaining.pop(sent.wire, None)
                refusal = (ShuttingDownError("the daemon is shutting down and takes no new work")
                           if status == SHUTTING_DOWN else self.send_refusal(status, result, index))
                if refusal is None:  # (the daemon said it was refused)
                    refusal = ProtocolError(f"the daemon at {self.channel.endpoint} refused a "
                                            "send with status 0")
                sent.finish(error=refusal)
                received.finish(NO_IDS)
                return
            sent.finish()
            count = self.num_envs
            if status == 0 and result == count:  # (the common case: all of them back)
                self._remaining.pop(sent.wire, None)
                received.finish(self._ids[:count].astype(np.int64))
                return
            self._batch_of[:] = sent.wire  # (the batch: RECVs will count its envs)
        else:
            count = received.wire
        if status == SHUTTING_DOWN:
            received.finish(NO_IDS, ShuttingDownError(
                "the daemon is shutting down and takes no new work"), lost=True)
            return
        if status != 0:
            # an env failed in a batch: its envs stay ready there for the RECV after it
            received.finish(NO_IDS, step_error(self.env_id, self.action_space, status,
                                              self._row_of(index, status), self.buffers))
            return
        if result != count:  # (a RECV answers exactly count ids)
            raise ProtocolError(f"the daemon at {self.channel.endpoint} answered a RECV of "
                                f"{count} envs with {result}")
        ids = self._ids[:count].astype(np.int64)  # (a copy, int64 whatever the segment)
        self._count_received(ids)
        received.finish(ids)

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

    def _read_posted(self) -> None:
        """Read a posted SEND's answer (waiting for it: the doorbell takes one
        request at a time); a refusal is kept for _raise_refusal."""
        ids, self._posted = self._posted, None
        if ids is None:
            return
        bell = self.doorbell
        assert bell is not None  # (a posted send keeps it: _ring drops it after this read only)
        answer = self._await(bell, SEND, "send")
        if answer is None:  # closed before it answered: the socket sends it, or says why
            self._call({"type": "send", "session": self.session}, [ids.tobytes()])
            return
        refusal = self.send_refusal(*answer)
        if refusal is not None and self._refusal is None:
            self._refusal = refusal

    def _call(self, header: dict[str, Any], blobs: Sequence = ()) -> dict[str, Any]:
        self._read_posted()  # (a reset's or render's request after the send's answer)
        return super()._call(header, blobs)

    def _step(self) -> int:
        if self.doorbell is not None:
            answer = self._ring(STEP, 0, "step")
            if answer is not None:
                status, num_done, index = answer
                if status == 0:  # (the hot path: nothing to map or raise)
                    return num_done
                if status == NATIVE_CODES["EBUSY"] and index < 0:  # envs out: which (doorbell.h)
                    if num_done > 0:
                        raise in_flight_error(self.env_id, "step", num_done)
                    raise ready_error(self.env_id, -num_done)
                index = self._row_of(index, status)
                self._raise_env_failure(status, index)
                raise step_error(self.env_id, self.action_space, status, index, self.buffers)
        return super()._step()

    def _send(self, env_ids: np.ndarray) -> None:
        """send's once the doorbell is gone, or closed (send rings an open
        one itself): the socket serves from now on, and says why at once."""
        if self.doorbell is not None:  # (closed)
            self.doorbell = None
            self._call({"type": "send", "session": self.session}, [env_ids.tobytes()])
            return
        super()._send(env_ids)

    def send_refusal(self, status: int, state: int, index: int) -> Exception | None:
        """The error of a send the doorbell answered (status, env state,
        error index), as in-process; None if it was not refused."""
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

    def _recv(self, count: int) -> np.ndarray:
        """Exactly count ids, the oldest ready (the daemon's session keeps the
        rest); an env failed in a batch raises as in-process (its batch's
        envs stay ready for the next recv)."""
        if self.doorbell is None:
            return super()._recv(count)
        answer = self._ring(RECV, count, "recv")
        if answer is None:
            return super()._recv(count)
        status, result, index = answer
        if status != 0:
            if status == NATIVE_CODES["ESTATE"] and index < 0:
                raise recv_short_error(self.env_id, count, result)
            index = self._row_of(index, status)
            self._raise_env_failure(status, index)
            raise step_error(self.env_id, self.action_space, status, index, self.buffers)
        ids = self._ids[:count].astype(np.int64)  # (a copy; int64 whatever the segment says)
        self._check_answer_ids(ids)
        return ids

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

    def _raise_env_failure(self, status: int, index: int) -> None:
        failure = self._env_failure(status, index)
        if failure is not None:
            raise failure

    def _env_failure(self, status: int, index: int) -> EnvError | None:
        """An env's own failure the daemon words (a hosted Python env raised,
        or its worker died: the doorbell's message) is the EnvError the
        socket path raises; without words, step_error's NativeError is."""
        if status == NATIVE_CODES["EENV"]:
            message = self.doorbell.message() if self.doorbell is not None else ""
            if message:
                return EnvError(f"{self.env_id}: {message}", status, index)
        return None

    def _ring(self, kind: int, count: int, what: str) -> tuple[int, int, int] | None:
        """A request through the doorbell (its inputs are in shared memory):
        its (status, result, error index), raising ShuttingDownError for the
        daemon's refusal; None once the daemon stopped serving the doorbell
        (the caller then asks over the socket, which says why)."""
        self._read_posted()
        bell = self.doorbell
        if bell is None or bell.closed:
            self.doorbell = None
            return None
        bell.ring(kind, count)
        answer = bell.quick_answer()
        if answer is None:
            answer = self._await(bell, kind, what)
            if answer is None:
                return self._ring(kind, count, what)  # closed meanwhile: drops the doorbell
        elif answer[0] == SHUTTING_DOWN:
            raise ShuttingDownError("the daemon is shutting down and takes no new work")
        return answer

    def _await(self, bell: Doorbell, kind: int, what: str) -> tuple[int, int, int] | None:
        """The answer to the request of kind rung last on bell (None: the
        daemon closed the doorbell without answering), raising
        ShuttingDownError for the daemon's refusal and EnvdTimeoutError after
        the client's timeout."""
        try:
            answer = bell.wait(time.monotonic() + self.channel.timeout, self.channel.check_alive)
        except TimeoutError:
            self.maybe_running = True  # until the answer comes: see check_buffers_free
            self.async_lost = kind != STEP  # the envs of a late send or recv are lost to us
            raise EnvdTimeoutError(
                f"no answer to a fast-path {what} from the daemon at {self.channel.endpoint} "
                f"within {self.channel.timeout:g} s (Client timeout)") from None
        if answer is None:
            return None
        status, result, index = answer
        if status == SHUTTING_DOWN:
            raise ShuttingDownError("the daemon is shutting down and takes no new work")
        return status, result, index
