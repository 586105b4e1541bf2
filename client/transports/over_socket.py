"""The shm transport: a daemon's session stepped over the socket, its arrays
in the session's shared-memory segment, mapped here.

A step writes the actions into the segment, sends one small message and
finds the results in place when the reply comes: nothing but the message
header crosses the socket.  The async books are the daemon's native session's
(the client keeps none): it refuses a step, reset or render while envs are
out, a send of an env not idle, a recv of more than are out, and answers a
recv with exactly count ids; ``reset`` with ``async: true`` is async_reset.

Every request is posted (envd.stepping.PostingStepper: a ticket its reply
finishes, once); the blocking step and recv are a post and a ``wait``, the
channel's zmq poll on the socket and its monitor (Channel.wait_posted), and
a blocking send is a post only (no round trip: the trainer goes on while the
daemon steps).  The daemon refuses a send only before stepping any of it and
answers a send at once, so its reply is in before the reply of the next
request.  A refusal is raised by the first call that starts after its reply
was read (a send, recv, step or render; a reset or async_reset forgets it, as
it forgets a failed batch); a call whose request went out before the reply
was read returns its result, and the call after it raises the refusal --
except a recv the daemon refuses for want of envs, which the refusal
explains better.  Those send tickets are the only async state kept here.
The inline transport (inline.py) and the doorbell (doorbell_stepper.py) are
this stepper with other encodings.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from envd import protocol
from envd.client.channel import Channel
from envd.errors import (
    ConnectionLostError,
    EnvdTimeoutError,
    EnvStateError,
    ProtocolError,
    SessionExpiredError,
    UnknownSessionError,
)
from envd.stepping import Ticket
from envd.vec_rows import RepeatCheck

#: a recv's errors that say the session (or its daemon) is gone
LOST_ERRORS = (SessionExpiredError, UnknownSessionError, ConnectionLostError)
#: the ids of a ticket that received none (read-only, shared)
NO_IDS = np.empty(0, np.int64)
NO_IDS.flags.writeable = False


class SocketStepper:
    """An envd.stepping.PostingStepper for one daemon session, over its channel."""

    #: the transport's name (RemoteVecEnv.transport)
    transport = "shm"
    #: replies carry the output arrays (_take_outputs copies them in)
    outputs_in_replies = False

    def __init__(self, channel: Channel, session: str, env_id: str,
                 action_space: spaces.Space, num_envs: int, buffers: dict[str, np.ndarray],
                 num_agents: int = 1):
        self.channel = channel
        self.session = session
        self.env_id = env_id
        self.action_space = action_space
        self.num_envs = num_envs  # envs: the ids of send and recv name them
        #: rows of each env in the buffers (a multi-agent env's agents, agent-major)
        self.num_agents = num_agents
        self.buffers = buffers
        #: a request timed out, or a step's wait was interrupted: the daemon
        #: may still use the buffers until its late reply (or the doorbell's
        #: late answer) says it ended (give_up, check_buffers_free)
        self.maybe_running = False
        #: the step given up on (give_up) whose answer may still come, and
        #: whether an interrupt (not a timeout) ended its wait
        self._late: Ticket | None = None
        self._late_interrupted = False
        #: a send or recv timed out or was interrupted: which envs are in flight is unknown
        self.async_lost = False
        #: the blocking sends' tickets whose refusal (if any) was not raised yet
        self._sends: list[Ticket] = []
        #: the first refusal of a blocking send, taken in but not raised yet
        self._refusal: BaseException | None = None
        self._step_header: dict[str, Any] = {"type": "step", "session": session}
        self._repeat_check: RepeatCheck | None = None  # (made by the first recv)
        #: posted tickets and their replies, read but not taken in yet (the
        #: channel runs reply callbacks under its lock, so they only queue;
        #: poll takes them in)
        self._inbox: list[tuple[Ticket, dict[str, Any]]] = []
        self._tickets_out = 0

    @property
    def fast_path(self) -> bool:
        """Steps, sends and recvs go through a doorbell (doorbell_stepper.py)."""
        return False

    @property
    def sends_unanswered(self) -> int:
        """Blocking sends whose reply was not taken in yet."""
        return sum(not ticket.done for ticket in self._sends)

    # ---- the Stepper protocol: the blocking calls, each a post and a wait --------------
    def reset(self, with_seeds: bool, with_mask: bool) -> None:
        reply = self._call(*self._request_reset(with_seeds, with_mask))
        self._take_outputs(reply, reply.get("_blobs", []), None)
        self._forget_refusals()  # (read by now: their replies came before the reset's)

    def async_reset(self, with_seeds: bool) -> None:
        request, blobs = self._request_reset(with_seeds, False)
        self._call({**request, "async": True}, blobs)  # (no outputs: recv carries the rows)
        self._forget_refusals()

    def step(self) -> int:
        if self._sends or self._refusal is not None:
            self._raise_refusal()
        ticket = self.post_step()
        self.wait(ticket)
        if ticket.error is not None:
            raise ticket.error
        return ticket.result

    def send(self, env_ids: np.ndarray) -> None:
        """Post the send (see the module docstring)."""
        if self.async_lost:
            self._refuse_async()
        if self._sends or self._refusal is not None:
            self._raise_refusal()
        try:
            self._sends.append(self._post_send(env_ids))  # waits while the window is full
        except EnvdTimeoutError:
            self.async_lost = True  # earlier sends' replies never came: their fate is unknown
            raise

    def recv(self, count: int) -> np.ndarray:
        """Exactly count ids, the oldest ready (the daemon's session keeps the rest)."""
        if self.async_lost:
            self._refuse_async()
        if self._sends or self._refusal is not None:
            self._raise_refusal()
        ticket = self.post_recv(count, exact=True)
        try:
            self.wait(ticket)
        except BaseException as exc:
            if not isinstance(exc, Exception):  # (an interrupt: its ids go to no ticket held)
                self.async_lost = True
            raise
        error = ticket.error
        if error is not None:
            if isinstance(error, EnvStateError):
                self._raise_refusal()  # too few out because a send was refused: say why
            raise error
        ids = ticket.ids
        assert ids is not None  # (a recv answered without an error names its envs)
        if len(ids) != count:
            raise ProtocolError(f"the daemon's recv reply holds {len(ids)} env ids, "
                                f"{count} were asked for")
        self._check_answer_ids(ids)
        return ids

    def render(self, out: np.ndarray) -> None:
        out[...] = self.frames()

    def frames(self) -> np.ndarray:
        """A new (num_envs, height, width, 3) uint8 array of every env's frame
        (their shape comes with the reply).  The daemon's session refuses it
        while envs are in flight or ready (not received), as in-process."""
        self._raise_refusal()
        reply = self._call({"type": "render", "session": self.session})
        blobs = reply.get("_blobs", [])
        shape = tuple(reply.get("frames", {}).get("shape", ()))
        if (len(shape) != 4 or shape[0] != self.num_envs or shape[3] != 3 or len(blobs) != 1
                or len(blobs[0]) != math.prod(shape)):
            raise ProtocolError(f"the daemon's render reply holds frames of shape {shape!r} in "
                                f"{len(blobs)} frame(s); expected {self.num_envs} RGB frames")
        return np.frombuffer(blobs[0], np.uint8).reshape(shape).copy()

    def env_call(self, request: bytes) -> bytes:
        """An env_call request (envd.info_codec-encoded) and its reply's
        results, still encoded (RemoteVecEnv.call)."""
        self._raise_refusal()
        reply = self._call({"type": "env_call", "session": self.session}, [request])
        blobs = reply.get("_blobs", [])
        if len(blobs) != 1:
            raise ProtocolError(f"the daemon's env_call reply has {len(blobs)} data frames, "
                                "not 1")
        return blobs[0]

    def close(self) -> None:
        """Nothing to free: the env closes the session, the mapping goes with it."""

    def check_buffers_free(self, deadline: float | None = None) -> None:
        """Raise while a call that timed out or was interrupted may still
        use the buffers (maybe_running), taking in the late answers that
        came first.  After an interrupted step (Ctrl-C: the daemon is
        likely healthy) its late answer is first waited for, at most the
        client's timeout and not past deadline (time.monotonic()), once.
        A step whose answer can no longer come (read, or dropped with the
        reply an interrupt cut short) runs no more.  A daemon gone raises
        ConnectionLostError instead of the refusal."""
        late = self._late
        if late is not None and self._late_interrupted and self._answer_pending(late):
            self._late_interrupted = False  # (once: after a timeout here, refuse at once)
            try:
                self.wait(late, deadline)
            except EnvdTimeoutError:
                pass  # (refused below, as after a step that timed out)
        self.channel.read_late_replies()
        self._take_inbox()  # (a late step reply clears maybe_running)
        if late is not None and (late.done or not self._answer_pending(late)):
            self.maybe_running = False  # (no answer can come: the daemon ran it to the end)
        if not self.maybe_running:
            self._late = None
            return
        self.check_alive("the answer of a call that timed out or was interrupted")
        raise EnvStateError(
            f"a call on this {self.env_id} env timed out or was interrupted and the "
            "daemon has not answered it yet: it may still use the env's buffers; retry "
            "later (or make a new env)")

    # ---- the non-blocking half (envd.stepping.PostingStepper) ----------------------------
    def post_step(self) -> Ticket:
        """Post the step; its reply finishes the ticket (its result)."""
        return self._post_ticket(Ticket("step"), *self._request_step())

    def post_send(self, env_ids: np.ndarray) -> Ticket:
        """Post the send (see PostingStepper); its reply finishes the ticket."""
        return self._post_send(env_ids)

    def post_recv(self, count: int, exact: bool = False) -> Ticket:
        """A recv of count envs; not exact: one that waits at the daemon
        until a batch finished and is answered with every env ready then
        (``min`` 1: the daemon's recv_min capability)."""
        header, blobs = self._request_recv(count)
        if not exact:
            header["min"] = 1
        return self._post_ticket(Ticket("recv"), header, blobs)

    def poll(self, ticket: Ticket) -> bool:
        """Read the replies that came (never waiting) and take in every
        posted ticket's; ticket.done."""
        if self._tickets_out:
            self.channel.read_late_replies()
            self._take_inbox()
        return ticket.done

    def wait(self, ticket: Ticket, deadline: float | None = None) -> None:
        """Wait for the ticket's reply on the channel (the zmq poll of its
        socket and monitor; not past deadline, see PostingStepper.wait) and
        take it in."""
        if ticket.done:
            return
        try:
            reply = self.channel.wait_posted(ticket.wire, ticket.kind, deadline)
            if reply is None:  # read meanwhile (by another call on the channel)
                self._take_inbox()
            else:
                self._take_reply(ticket, reply)
        except BaseException as exc:  # (a timeout, or an interrupt: Ctrl-C in a notebook)
            self.give_up(ticket, exc)
            raise

    def give_up(self, ticket: Ticket, error: BaseException) -> None:
        """A wait for ticket ended by error before its answer was taken in.
        A step whose answer can still come (_answer_pending: timed out, or
        interrupted: KeyboardInterrupt) may still be running on the
        buffers: every later call refuses until its late answer came
        (check_buffers_free; after an interrupt it waits for it first), so
        that nothing writes inputs the daemon may still read, and the late
        answer is taken in (a step's outputs) before a later call's own (a
        reset's).  A step whose answer cannot come (read already) marks
        nothing.  A send or recv that timed out loses the async books (its
        ids would go to a ticket nobody reads); an interrupted one's ticket
        is kept and its answer still taken in by whoever holds it (the
        multi-daemon stepper's books), but the blocking recv() drops its
        ticket, so an interrupt there loses them too (recv).  A daemon gone
        (ConnectionLostError) runs nothing."""
        if ticket.done or isinstance(error, ConnectionLostError):
            return
        if ticket.kind == "step":
            if self._answer_pending(ticket):
                self.maybe_running = True
                self._late = ticket
                self._late_interrupted = not isinstance(error, EnvdTimeoutError)
        elif isinstance(error, EnvdTimeoutError):
            self.async_lost = True  # the envs of a late send or recv are lost to us

    def _answer_pending(self, ticket: Ticket) -> bool:
        """Ticket's answer may still be taken in: its reply is queued here,
        or the channel still awaits it."""
        # (the channel first: a reply it stops awaiting is in the inbox by
        # the time awaits answers, Channel.awaits)
        if isinstance(ticket.wire, int) and self.channel.awaits(ticket.wire):
            return True
        return any(queued is ticket for queued, _ in self._inbox)

    def waitables(self, ticket: Ticket) -> tuple[Any, ...]:
        """The channel's socket and its connection monitor (zmq sockets):
        once the socket is readable, poll; once the monitor is, check_alive."""
        return self.channel.pollables()

    def check_alive(self, waiting_for: str) -> None:
        self.channel.check_alive(waiting_for)

    def _post_send(self, env_ids: np.ndarray) -> Ticket:
        """A send of env_ids (the blocking send's and post_send's)."""
        return self._post_ticket(Ticket("send"), *self._request_send(env_ids))

    def _post_ticket(self, ticket: Ticket, header: dict[str, Any], blobs: Sequence) -> Ticket:
        inbox = self._inbox  # (the callback holds the list only: never the segment's
        # views, should the daemon die and the channel keep the callback)
        ticket.wire = self.channel.post(header, blobs, lambda reply: inbox.append((ticket, reply)))
        ticket.posted = True
        self._tickets_out += 1
        return ticket

    def _take_inbox(self) -> None:
        while self._inbox:
            self._take_reply(*self._inbox.pop(0))

    def _take_reply(self, ticket: Ticket, reply: dict[str, Any]) -> None:
        """A posted ticket's reply into the ticket (the one place replies
        to steps, sends and recvs are read).  An interrupt (Ctrl-C) while
        it is taken in (an inline reply's arrays half copied) queues the
        reply again: the next call takes it in whole (check_buffers_free,
        poll), and until then the step counts as may still be running."""
        self._tickets_out -= 1
        kind = ticket.kind
        try:
            if kind == "step":
                self.maybe_running = False  # (a late one: the daemon is done with the buffers)
            if not reply.get("ok"):
                error = protocol.error_from_reply(reply)
                ticket.finish(NO_IDS, error, isinstance(error, LOST_ERRORS))
                return
            if kind == "send":
                ticket.done = True
                return
            blobs = reply.get("_blobs", [])
            if kind == "step":
                self._take_outputs(reply, blobs, None)
                ticket.done, ticket.result = True, reply["num_done"]
                return
            ids = np.frombuffer(blobs[0], np.int64).copy() if blobs else NO_IDS
            if self.outputs_in_replies and len(ids) and ids.view(np.uint64).max() < self.num_envs:
                # (ids it cannot index: refused by the caller's checks, rows untouched)
                self._take_outputs(reply, blobs[1:], ids)
            ticket.finish(ids)
        except BaseException as exc:
            if not isinstance(exc, Exception) and not ticket.done:
                self._tickets_out += 1
                self._inbox.insert(0, (ticket, reply))
                if kind == "step":
                    self.maybe_running = True
            raise

    # ---- the wire: what a transport changes --------------------------------------------
    def _request_reset(self, with_seeds: bool, with_mask: bool) -> tuple[dict, Sequence]:
        return {"type": "reset", "session": self.session, "seeds": with_seeds,
                "mask": with_mask}, ()

    def _request_step(self) -> tuple[dict, Sequence]:
        return dict(self._step_header), ()

    def _request_send(self, env_ids: np.ndarray) -> tuple[dict, Sequence]:
        return {"type": "send", "session": self.session}, [env_ids.tobytes()]

    def _request_recv(self, count: int) -> tuple[dict, Sequence]:
        return {"type": "recv", "session": self.session, "count": count}, ()

    def _take_outputs(self, reply: dict[str, Any], blobs: list, rows: np.ndarray | None) -> None:
        """The outputs a reply carries (none here: they are in shared memory)."""

    # ---- helpers ------------------------------------------------------------------------
    def rows_of(self, env_ids: np.ndarray) -> np.ndarray:
        """The buffer rows of envs env_ids, in their order (agent-major)."""
        if self.num_agents == 1:
            return env_ids
        return (env_ids[:, None] * self.num_agents + np.arange(self.num_agents)).ravel()

    def _check_answer_ids(self, ids: np.ndarray) -> None:
        """Refuse a recv answer (int64 ids) naming an env that does not exist
        (the gather, BatchedVecEnv._gather, indexes the buffers with these
        ids unchecked) or an env twice (a send of the batch straight back
        skips the id checks: envd.vec_rows.LastBatch)."""
        # (a negative id is huge as uint64: one pass, not min and max)
        if len(ids) and ids.view(np.uint64).max() >= self.num_envs:
            raise ProtocolError(f"the daemon's recv answer names env ids outside "
                                f"[0, {self.num_envs}): {ids.min()}..{ids.max()}")
        if self._repeat_check is None:
            self._repeat_check = RepeatCheck(self.num_envs)
        if self._repeat_check.repeats(ids):
            raise ProtocolError("the daemon's recv answer names an env twice")

    def _raise_refusal(self) -> None:
        """Raise (once) the first refusal of the blocking sends whose replies
        came, taking in the replies that came already (never waiting)."""
        sends = self._sends
        if sends:
            self._take_inbox()  # (replies read while an earlier call waited)
            if not sends[-1].done:
                self.poll(sends[-1])
            while sends and sends[0].done:
                error = sends.pop(0).error
                if error is not None and self._refusal is None:
                    self._refusal = error
        if self._refusal is not None:
            refusal, self._refusal = self._refusal, None
            raise refusal

    def _forget_refusals(self) -> None:
        """A reset forgets the sends' refusals (their replies came before its own)."""
        self._take_inbox()
        self._sends = [ticket for ticket in self._sends if not ticket.done]  # (none: a reply lost)
        self._refusal = None

    def _refuse_async(self) -> None:
        raise EnvStateError(
                f"a send or recv on this {self.env_id} env timed out or was interrupted, so "
                "which envs are in flight is unknown; close it and make a new env")

    def _call(self, header: dict[str, Any], blobs: Sequence = ()) -> dict[str, Any]:
        """A request that waits for its reply (reset, render, env_call)."""
        try:
            return self.channel.request(header, blobs, late=self._late_reply_came)
        except EnvdTimeoutError:
            self.maybe_running = True  # (until its late reply: _late_reply_came)
            self._late = None
            raise

    def _late_reply_came(self, reply: dict[str, Any]) -> None:
        self.maybe_running = False
