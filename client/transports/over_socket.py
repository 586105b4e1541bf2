"""The shm transport: a daemon's session stepped over the socket, its arrays
in the session's shared-memory segment, mapped here.

A step writes the actions into the segment, sends one small message and
finds the results in place when the reply comes: nothing but the message
header crosses the socket.  A send is posted (no round trip: the trainer
goes on while the daemon steps); the daemon refuses a send only before
stepping any of it and answers a send at once, so its reply is in before
the reply of the next request, and a refusal is raised by the next call
that needs it (recv, reset, step).  The inline transport (inline.py) and the
doorbell (doorbell_stepper.py) are this stepper with other encodings.
"""
from __future__ import annotations

import math
import time
from typing import Any, Sequence

import numpy as np
from gymnasium import spaces

from envd import protocol
from envd.client.channel import Channel
from envd.client.transports.books import AsyncBooks
from envd.errors import EnvdTimeoutError, EnvStateError, ProtocolError
from envd.vector_base import in_flight_error


class SocketStepper:
    """An envd.stepping.Stepper for one daemon session, over its channel."""

    #: the transport's name (RemoteVecEnv.transport)
    transport = "shm"

    def __init__(self, channel: Channel, session: str, env_id: str,
                 action_space: spaces.Space, num_envs: int, buffers: dict[str, np.ndarray]):
        self.channel = channel
        self.session = session
        self.env_id = env_id
        self.action_space = action_space
        self.num_envs = num_envs
        self.buffers = buffers
        self.books = AsyncBooks(env_id, num_envs)
        #: a request timed out: the daemon may still use the buffers until
        #: its late reply (or the doorbell's late answer) says it ended
        self.maybe_running = False
        #: a send or recv timed out: which envs are in flight is unknown
        self.async_lost = False
        #: posted sends whose reply was not read yet
        self.sends_unanswered = 0
        self._refused: list[tuple[np.ndarray, dict[str, Any]]] = []  # (ids, error reply)
        self._step_header = {"type": "step", "session": session}

    @property
    def fast_path(self) -> bool:
        """Steps, sends and recvs go through a doorbell (doorbell_stepper.py)."""
        return False

    # ---- the Stepper protocol ---------------------------------------------------------
    def reset(self, with_seeds: bool, with_mask: bool) -> None:
        self._settle_sends()
        self.books.check_idle("reset")
        self._reset(with_seeds, with_mask)

    def async_reset(self, with_seeds: bool) -> None:
        self._settle_sends()
        while self.books.num_in_flight:  # their results are dropped
            self._take_finished(self.books.num_in_flight, report=False)
        self._reset(with_seeds, False)
        self.books.all_ready()

    def step(self) -> int:
        if self.books.active:
            self._settle_sends()
            self.books.check_idle("step")
        return self._step()

    def send(self, env_ids: np.ndarray) -> None:
        self._check_async_state()
        self.books.check_sendable(env_ids)
        self._send(env_ids)
        self.books.sent(env_ids)

    def recv(self, count: int) -> np.ndarray:
        books = self.books
        if books.num_ready + books.num_in_flight < count:
            self._settle_sends()  # a refused send explains it better
            books.check_recv(count)
        if books.error is not None:
            raise books.take_error()
        while books.num_ready < count:
            self._take_finished(count - books.num_ready)
        return books.pop(count)

    def render(self, out: np.ndarray) -> None:
        out[...] = self.frames()

    def frames(self) -> np.ndarray:
        """A new (num_envs, height, width, 3) uint8 array of every env's frame
        (their shape comes with the reply)."""
        if self.books.num_in_flight:
            raise in_flight_error(self.env_id, "render", self.books.num_in_flight)
        reply = self._call({"type": "render", "session": self.session})
        blobs = reply.get("_blobs", [])
        shape = tuple(reply.get("frames", {}).get("shape", ()))
        if (len(shape) != 4 or shape[0] != self.num_envs or shape[3] != 3 or len(blobs) != 1
                or len(blobs[0]) != math.prod(shape)):
            raise ProtocolError(f"the daemon's render reply holds frames of shape {shape!r} in "
                                f"{len(blobs)} frame(s); expected {self.num_envs} RGB frames")
        return np.frombuffer(blobs[0], np.uint8).reshape(shape).copy()

    def close(self) -> None:
        """Nothing to free: the env closes the session, the mapping goes with it."""

    def check_buffers_free(self) -> None:
        """Raise while a call that timed out may still use the buffers."""
        self.channel.read_late_replies()
        if self.maybe_running:
            raise EnvStateError(
                f"a call on this {self.env_id} env timed out and the daemon has not "
                "answered it yet: it may still use the env's buffers; retry later (or "
                "make a new env)")

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

    # ---- requests -----------------------------------------------------------------------
    def _reset(self, with_seeds: bool, with_mask: bool) -> None:
        reply = self._call(*self._request_reset(with_seeds, with_mask))
        self._take_outputs(reply, reply.get("_blobs", []), None)

    def _step(self) -> int:
        reply = self._call(*self._request_step())
        self._take_outputs(reply, reply.get("_blobs", []), None)
        return reply["num_done"]

    def _send(self, env_ids: np.ndarray) -> None:
        """Post the send: returns without a round trip."""

        def on_reply(reply: dict[str, Any]) -> None:
            self.sends_unanswered -= 1
            if not reply.get("ok"):
                self._refused.append((env_ids, reply))

        header, blobs = self._request_send(env_ids)
        try:
            self.channel.post(header, blobs, on_reply)  # waits while the window is full
        except EnvdTimeoutError:
            self.async_lost = True  # earlier sends' replies never came: their fate is unknown
            raise
        self.sends_unanswered += 1

    def _take_finished(self, wanted: int, report: bool = True) -> None:
        """Wait for sent envs to finish (about wanted of them) and mark them
        ready; with report, raise a failure waiting for recv."""
        books = self.books
        finished = self._collect(wanted)
        if not finished and books.error is None:
            raise books.broken()  # never spin on it
        for ids in finished:
            books.finished(ids)
        if report and books.error is not None:
            raise books.take_error()  # the envs are ready; their failed results are in the rows

    def _collect(self, wanted: int) -> list[np.ndarray]:
        self._check_async_state()
        self._settle_sends(poll=False)  # (this recv's wait reads the replies in order)
        if not self.books.num_in_flight:  # every env in flight was refused
            return []
        return self._recv_finished(max(1, min(wanted, self.books.num_in_flight)))

    def _recv_finished(self, count: int) -> list[np.ndarray]:
        """Every env found finished once count are (the daemon's recv)."""
        try:
            reply = self._call(*self._request_recv(count))
        except EnvdTimeoutError:
            self.async_lost = True  # the late reply's ids would be lost to us
            raise
        except EnvStateError:
            if not self._refused:
                raise
            # the daemon missed envs whose send it refused (their replies came
            # first): take them back; the refusal is raised instead
            self._settle_sends(poll=False)
            return []
        self._settle_sends(poll=False)
        ids = np.frombuffer(reply["_blobs"][0], np.int64).copy()
        self._take_outputs(reply, reply["_blobs"][1:], ids)
        return [ids]

    def _settle_sends(self, poll: bool = True) -> None:
        """Account for posted sends the daemon refused: their envs are idle
        again and the first refusal waits for the next recv.  poll: first
        read the replies of the sends posted so far (the daemon answers a
        send at once; one that stopped answering is waited for no longer
        than the channel's timeout, then its refusals are unknown)."""
        deadline = time.monotonic() + self.channel.timeout
        while poll and self.sends_unanswered and time.monotonic() < deadline:
            self.channel.read_late_replies(wait=0.05)
        refused, self._refused = self._refused, []
        for env_ids, reply in refused:  # never stepped: idle again
            self.books.refused(env_ids, protocol.error_from_reply(reply))

    def _check_async_state(self) -> None:
        if self.async_lost:
            raise EnvStateError(
                f"a send or recv on this {self.env_id} env timed out, so which envs are in "
                "flight is unknown; close it and make a new env")

    def _call(self, header: dict[str, Any], blobs: Sequence = ()) -> dict[str, Any]:
        try:
            return self.channel.request(header, blobs, late=self._late_reply_came)
        except EnvdTimeoutError:
            self.maybe_running = True
            raise

    def _late_reply_came(self, reply: dict[str, Any]) -> None:
        self.maybe_running = False
