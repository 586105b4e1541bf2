"""The stepping handlers (reset, async reset, step, send, recv, fast, render)
and the books of the requests that wait on the pool.

Each handler checks the request, writes its inputs into the session's buffers
and makes one call to the session's NativeSession (envd.native.native_session),
which keeps the async books and refuses what they do not allow (a step while
envs are in flight or ready, a send of an env not idle, ...); nothing here
keeps per-env state.  What waits is kept here, one entry per
session at most (a session takes one request at a time, server/lifecycle.py):
  - a sync step submitted to the pool, answered when the pool's eventfd says
    it finished (on_pool_event), or at once when the vec ran it inline;
  - a recv parked until enough sent envs are ready, retried on each pool event
    (sends of its session are served meanwhile: a client driving several
    daemons keeps one recv waiting on each while it sends, client/multi_async.py);
  - the sessions the pool events look at: those with async batches in flight
    (a closing one is freed once they settle) and every one whose recv is
    parked, until it is answered (see _track_batches: a batch may end between
    a retry's look and the count of envs in flight, and only its own event,
    still to come, can answer the recv then).
Reset (and async reset, which waits for the batches in flight) and render
run on the Service's executor and reply from its callback.
All of it runs on the event loop thread.
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from envd import info_codec, protocol
from envd.errors import DaemonError, EnvdError, EnvStateError, InvalidArgumentError, LimitExceededError
from envd.int_args import check_int
from envd.native.hosted_calls import MAX_CALL_OBJECTS, MAX_REQUEST_BYTES
from envd.server.fair_ops import Done
from envd.server.hosted import HostedServerSession
from envd.server.sessions import ClientRecord, Session, async_in_flight

#: Operations that run on the executor holding the session's lock (the event
#: loop must not wait for that lock: it would stall every client meanwhile).
_ON_THE_EXECUTOR = frozenset({"reset", "async_reset", "render", "call", "set_attr"})

if TYPE_CHECKING:
    from envd.server.service import Service

log = logging.getLogger("envd.server")

Handler = Callable[[ClientRecord, dict[str, Any], list[bytes]], "dict | None"]


class PendingStep(NamedTuple):
    """A sync step on the pool, answered when it finishes."""
    identity: bytes
    request_id: int
    started: float  # perf_counter at submit (the step latency metric)
    inline: bool    # the reply carries the outputs as data frames


class ParkedRecv(NamedTuple):
    """A recv waiting for least sent envs to be ready (it takes up to most)."""
    identity: bytes
    request_id: int
    most: int
    least: int
    inline: bool


class SteppingHandlers:
    """reset, step, send, recv, fast and render for one Service."""

    def __init__(self, service: Service):
        self.service = service
        self.config = service.config
        self._pending_steps: dict[Session, PendingStep] = {}
        self._parked_recvs: dict[Session, ParkedRecv] = {}
        self._async_sessions: set[Session] = set()  # with batches in flight
        self.fast_path_sessions = 0  # sessions whose doorbell a doorbell thread serves

    def handlers(self) -> dict[str, Handler]:
        return {"reset": self.reset, "step": self.step, "send": self.send,
                "recv": self.recv, "fast": self.fast, "render": self.render,
                "env_call": self.env_call}

    @property
    def idle(self) -> bool:
        """No step or async batch is on the pool for a socket request, and no
        recv waits for one."""
        return not self._pending_steps and not self._async_sessions and not self._parked_recvs

    @property
    def sessions_stepping(self) -> int:
        """Sessions with a sync step or async batches on the pool now."""
        return len(self._pending_steps) + len(self._async_sessions)

    def forget_all(self) -> None:
        """At shutdown, once every session was freed: nothing waits any more."""
        self._pending_steps.clear()
        self._parked_recvs.clear()
        self._async_sessions.clear()

    # ---- reset and render (on the executor) ---------------------------------------------------
    def reset(self, client: ClientRecord, header: dict[str, Any], blobs: list[bytes]) -> None:
        session = self.service.session_for(client, header)
        with_seeds, with_mask = header.get("seeds", False), header.get("mask", False)
        inline, is_async = header.get("inline", False), header.get("async", False)
        if is_async and with_mask:
            raise protocol.BadRequest("reset: an async reset resets every env; it takes no "
                                      "mask")
        if inline:  # the inputs come as blobs: seeds first, then the mask
            if len(blobs) != with_seeds + with_mask:
                raise protocol.BadRequest(
                    f"inline reset: {with_seeds + with_mask} data frame(s) are needed "
                    f"(seeds: {with_seeds}, mask: {with_mask}), got {len(blobs)}")
            for name, blob in zip([n for n, given in (("reset_seeds", with_seeds),
                                                      ("reset_mask", with_mask)) if given], blobs):
                session.read_input(name, blob)
        elif blobs:
            raise protocol.BadRequest("reset: data frames are only taken with inline: true")
        # (a mask selecting no env is refused by the vec, on its private copy;
        # envs in flight by the session; an async reset waits for them)
        self.service.check_op_room(client)  # (before the session turns busy)
        session.life.begin("async_reset" if is_async else "reset")
        session.segment.bump_step_seq()  # the counters cover resets too

        def reply_of(future: Done) -> dict:
            session.segment.bump_done_seq()
            reply = self.service.result_reply(header["id"], future)
            if not session.life.freed:  # (an async reset's batches were dropped;
                self._track_batches(session)  # pool events skipped it meanwhile)
            if session.revoked:
                reply = self.service.revoked_reply(session, header["id"])
            elif inline and reply["ok"] and not is_async:  # (recv carries an async reset's rows)
                reply.update(session.outputs())
            return reply

        def done(future: Done) -> None:
            self._answer_operation(client, session, header["id"], lambda: reply_of(future))

        if is_async:
            self.service.submit(client.identity, lambda: session.async_reset(with_seeds), done)
        else:
            self.service.submit(client.identity, lambda: session.reset(with_seeds, with_mask),
                                done)
        return None

    def render(self, client: ClientRecord, header: dict[str, Any], blobs: list[bytes]) -> None:
        """Draw every env's frame on the executor; the reply carries them in one
        data frame, so a render of more bytes than --max-message-bytes is refused
        before anything is drawn (and the reply counts against the unread-reply
        budgets like any large reply)."""
        session = self.service.session_for(client, header)
        if session.render_mode is None:
            raise EnvStateError(
                f"session {session.id} ({session.spec.id}) was made without a render mode; "
                "make it with render_mode='rgb_array' to render")
        limit = self.config.max_message_bytes
        hosted = isinstance(session, HostedServerSession)
        if not hosted:
            # (a hosted session's frames' size is known once drawn: the workers'
            # replies and the frames together are bounded by the limit then,
            # HostedServerSession.render)
            frame = session.frame_shape()
            shape = (session.num_envs, *frame)
            size = math.prod(shape)
            if size > limit:
                height, width, _ = frame
                raise LimitExceededError(
                    f"rendering {session.num_envs} {session.spec.id} envs makes {size} bytes "
                    f"of frames ({height}x{width}x3 each), over the daemon's message limit of "
                    f"{limit} bytes (--max-message-bytes); render a session of at most "
                    f"{limit // (size // shape[0])} envs, or ask the operator to raise the "
                    "limit")
        self._run_operation(client, session, header["id"], "render",
                            lambda: session.render(limit),
                            lambda frames: {
                                "frames": {"dtype": "uint8", "shape": list(frames.shape)},
                                "_blobs": [memoryview(frames).cast("B")]})
        return None

    def env_call(self, client: ClientRecord, header: dict[str, Any], blobs: list[bytes]
                 ) -> None:
        """call / get_attr / set_attr on a hosted session's envs (blob 0: the
        request, info_codec-encoded: msgpack, never pickle), run in its
        workers on the executor like a render; the reply's blob 0 holds the
        per-env results, encoded the same way."""
        session = self.service.session_for(client, header)
        if not isinstance(session, HostedServerSession):
            raise InvalidArgumentError(
                f"{session.spec.id}: call, get_attr and set_attr reach hosted Python envs "
                "only; a built-in env's VecEnv has spec, metadata and the spaces")
        if len(blobs) != 1:
            raise protocol.BadRequest(f"env_call: 1 data frame is needed, got {len(blobs)}")
        request = _env_call_request(blobs[0], session.num_envs)
        limit = self.config.max_message_bytes
        self._run_operation(client, session, header["id"], request["op"],
                            lambda: session.env_call(request, limit),
                            lambda data: {"_blobs": [data]})
        return None

    def _run_operation(self, client: ClientRecord, session: Session, request_id: int,
                       operation: str, run: Callable[[], Any],
                       result: Callable[[Any], dict]) -> None:
        """run() on the executor (a fair share: server/fair_ops.py), the
        session busy meanwhile; answered with result(run's value)'s fields."""
        self.service.check_op_room(client)
        session.life.begin(operation)

        def reply_of(future: Done) -> dict:
            reply = self.service.result_reply(request_id, future)
            if session.revoked:
                reply = self.service.revoked_reply(session, request_id)
            elif reply["ok"]:
                reply.update(result(future.result()))
            if not session.life.freed:  # (pool events skipped it meanwhile)
                self._track_batches(session)
            return reply

        def done(future: Done) -> None:
            self._answer_operation(client, session, request_id, lambda: reply_of(future))

        self.service.submit(client.identity, run, done)

    def _answer_operation(self, client: ClientRecord, session: Session, request_id: int,
                          reply_of: Callable[[], dict]) -> None:
        """End the session's operation that ran on the executor and answer it
        exactly once: with reply_of()'s reply, or, should building it raise (a
        bug), an internal error; the session is never left busy."""
        try:
            reply = reply_of()
        except Exception:  # a bug: still answer, and free the session's turn
            log.exception("internal error while answering an operation")
            reply = protocol.error_reply(request_id, DaemonError(
                "internal error in the daemon; its log has the details"))
        session.life.end()
        self.service.send(client.identity, reply)

    # ---- sync step (on the pool) --------------------------------------------------------------
    def step(self, client: ClientRecord, header: dict[str, Any], blobs: list[bytes]) -> dict | None:
        session = self.service.session_for(client, header)
        self._check_not_fast_path(session, "step")
        if "actions" in header:
            if not blobs:
                raise protocol.BadRequest("step: 'actions' is given but no data frame follows")
            session.write_actions(header["actions"], blobs[0])
        elif blobs:
            raise protocol.BadRequest("step: a data frame needs an 'actions' description")
        inline = header.get("inline", False)
        if inline and "actions" not in header:
            raise protocol.BadRequest("inline step: the actions must come as a data frame "
                                      "with an 'actions' description")
        started = time.perf_counter()
        finished = session.native.step_submit()  # refused while envs are in flight or ready
        session.segment.bump_step_seq()
        if finished:  # ran inline: no eventfd event comes
            reply = self._finish_step(session, header["id"], inline)
            self.service.step_latency(time.perf_counter() - started)
            return reply
        session.life.begin("step")
        self._pending_steps[session] = PendingStep(client.identity, header["id"], started, inline)
        return None

    def _finish_step(self, session: Session, request_id: int, inline: bool) -> dict:
        session.segment.bump_done_seq()  # failed or not, the buffers are free again
        try:
            num_done = session.native.step_finish()
        except EnvdError as exc:
            return protocol.error_reply(request_id, exc)
        self.count_steps(session)
        if session.revoked:  # its results went to zero pages
            return self.service.revoked_reply(session, request_id)
        reply = protocol.ok_reply(request_id, num_done=num_done)
        if inline:
            reply.update(session.outputs())
        return reply

    # ---- async send and recv ------------------------------------------------------------------
    def send(self, client: ClientRecord, header: dict[str, Any], blobs: list[bytes]) -> dict:
        # (served beside a parked recv: the native session's books take the
        # batch as any other; the recv is retried on the next pool event)
        session = self.service.session_for(client, header, beside="recv")
        self._check_not_fast_path(session, "send")
        inline = header.get("inline", False)
        if (len(blobs) != 1 + inline or not 8 <= len(blobs[0]) <= 8 * session.num_envs
                or len(blobs[0]) % 8):
            raise protocol.BadRequest(
                f"send: one data frame of 1 to {session.num_envs} env ids (int64) is needed"
                + (", then one of their actions (inline)" if inline else ""))
        env_ids = np.frombuffer(blobs[0], np.int64).copy()
        if inline:
            session.write_action_rows(env_ids, blobs[1])
        # Validation errors raise before anything is stepped; an env failing
        # in this batch (run inline) is reported by the next recv, which the
        # client makes for these envs anyway: the send itself succeeded.
        session.native.send(env_ids, notify=True)
        parked = self._parked_recvs.get(session)
        if parked is not None:  # a batch run inline sends no pool event: look now
            self._retry_recv(session, parked)
        self._track_batches(session)  # (after the retry: it may have answered the recv)
        return protocol.ok_reply(header["id"])

    def recv(self, client: ClientRecord, header: dict[str, Any], blobs: list[bytes]) -> dict | None:
        session = self.service.session_for(client, header)
        self._check_not_fast_path(session, "recv")
        count = check_int("count", header["count"], 1, session.num_envs)
        least = check_int("min", header.get("min", count), 1, count)
        inline = header.get("inline", False)
        ids = self._try_recv(session, count, least)  # raises a batch's env failure, or too few sent
        if ids is not None:
            self._track_batches(session)
            return self._recv_reply(session, header["id"], inline, ids)
        session.life.begin("recv")
        self._parked_recvs[session] = ParkedRecv(client.identity, header["id"], count, least,
                                                 inline)
        self._async_sessions.add(session)  # (it is: fewer are ready than were sent)
        return None

    def _retry_recv(self, session: Session, parked: ParkedRecv) -> None:
        """Answer a parked recv if enough envs are ready now (or a batch failed)."""
        try:
            ids = self._try_recv(session, parked.most, parked.least)
        except EnvdError as exc:  # an env failed: the waiting recv reports it
            reply = protocol.error_reply(parked.request_id, exc)
        else:
            if ids is None:
                return
            reply = self._recv_reply(session, parked.request_id, parked.inline, ids)
        del self._parked_recvs[session]
        session.life.end()
        self.service.send(parked.identity, reply)

    @staticmethod
    def _try_recv(session: Session, count: int, least: int) -> np.ndarray | None:
        """The oldest ready ids once at least `least` are ready: all of them
        up to count (None before; raises as NativeSession.try_recv).  Only
        this thread takes ready envs, so those counted stay ready for the take."""
        if least < count:
            ready = session.native.counts()[1]
            count = min(count, max(ready, least))
        return session.native.try_recv(count)

    def _recv_reply(self, session: Session, request_id: int, inline: bool,
                    ids: np.ndarray) -> dict:
        if session.revoked:  # their results went to zero pages
            return self.service.revoked_reply(session, request_id)
        self.count_steps(session)
        if not inline:
            return protocol.ok_reply(request_id, _blobs=[ids.tobytes()])
        outputs = session.outputs(ids)
        return protocol.ok_reply(request_id, arrays=outputs["arrays"],
                                 _blobs=[ids.tobytes(), *outputs["_blobs"]])

    # ---- completion ---------------------------------------------------------------------------
    def on_pool_event(self) -> None:
        """Answer every submitted step that finished and every parked recv
        that can be; free closing sessions whose batches settled."""
        for session, pending in list(self._pending_steps.items()):
            if session.native.step_done():
                del self._pending_steps[session]
                reply = self._finish_step(session, pending.request_id, pending.inline)
                session.life.end()
                self.service.send(pending.identity, reply)
                self.service.step_latency(time.perf_counter() - pending.started)
        for session in list(self._async_sessions):
            if session.life.operation in _ON_THE_EXECUTOR:
                # it holds the session's lock on the executor (an async reset
                # while it waits for these batches; a reset or render while it
                # runs), so counts() would block the loop; its reply re-tracks
                continue
            parked = self._parked_recvs.get(session)
            if parked is not None:
                self._retry_recv(session, parked)
            if session.life.freed:
                self._async_sessions.discard(session)
            else:
                self._track_batches(session)
            session.life.settle()

    def _track_batches(self, session: Session) -> None:
        """Keep the session among those the pool events look at (on_pool_event
        looks at those only) while it has batches in flight or a parked recv.
        The recv counts on its own: a pool event retries it and finds too few
        envs ready, then the last batch ends before the event counts the envs
        in flight (none, now).  That batch writes the eventfd after its done
        flag, so its event is still to come, and only that event can answer
        the recv: were the session dropped here on "nothing in flight", the
        recv would wait forever.  A fast-path session's batches are its
        doorbell's (a socket send is refused), and the doorbell's thread may
        hold its lock as long as a hosted env hangs: its lock is never
        waited for here, on the event loop."""
        if session.fast_path:
            self._async_sessions.discard(session)
        elif session in self._parked_recvs or session.native.counts()[0]:
            self._async_sessions.add(session)
        else:
            self._async_sessions.discard(session)

    # ---- the fast path ------------------------------------------------------------------------
    def fast(self, client: ClientRecord, header: dict[str, Any], blobs: list[bytes]) -> dict:
        """Serve the session's steps, sends and recvs from the doorbell in its
        header page (or stop doing so: enable false)."""
        session = self.service.session_for(client, header)
        if not header.get("enable", True):
            if session.fast_path:
                # Never waits for the lock on the loop: the doorbell's thread
                # holds it for the whole request it serves, which a hosted
                # env may hang forever.  Under the lock no request runs and
                # none starts (a stopped doorbell thread takes it no more).
                with session.locked("turning the fast path off"):
                    if any(session.native.counts()):
                        raise async_in_flight("turning the fast path off")
                    self.stop_doorbell(session)
            return protocol.ok_reply(header["id"])
        if not session.fast_path:
            # Envs sent over the socket are the event loop's to collect: were
            # the doorbell to serve them, a close would free the session on
            # the loop at once and wait there for their batch (and each pool
            # event would wait for the doorbell's lock).  No doorbell thread
            # exists yet and a busy session was refused, so this never blocks.
            if any(session.native.counts()):
                raise async_in_flight("turning the fast path on")
            if self.fast_path_sessions >= self.config.fast_path_sessions:
                raise LimitExceededError(
                    f"the daemon serves its maximum of {self.config.fast_path_sessions} "
                    "fast-path sessions (--fast-path-sessions); this session steps over "
                    "the socket")
            session.start_doorbell(self.config.fast_path_spin_us * 1000)
            self.fast_path_sessions += 1
            if self.service.draining:
                session.native.drain()
        return protocol.ok_reply(header["id"], doorbell={"offset": protocol.DOORBELL_OFFSET})

    def stop_doorbell(self, session: Session, freeing: bool = False) -> None:
        """Stop a session's fast path (after the request it serves) and count
        its steps.  freeing: the session is being freed (Session.stop_doorbell)."""
        session.stop_doorbell(freeing)
        self.count_steps(session)
        self.fast_path_sessions -= 1

    def count_steps(self, session: Session, collect: bool = False) -> None:
        """Fold the steps the session served since last time, by every path
        (a socket step or recv, the doorbell), into the counters (collect:
        see Session.new_steps)."""
        steps, env_steps = session.new_steps(collect)
        session.steps += steps
        session.env_steps += env_steps
        self.service.count_steps(session, env_steps)

    # ---- checks -------------------------------------------------------------------------------
    @staticmethod
    def _check_not_fast_path(session: Session, call: str) -> None:
        # The doorbell thread steps the vec whenever the doorbell rings: a
        # step of the event loop beside it would race it.
        if session.fast_path:
            raise EnvStateError(f"{call} over the socket on session {session.id}, whose steps "
                                "the fast path serves (its doorbell in shared memory)")


def _env_call_request(blob: bytes, num_envs: int) -> dict[str, Any]:
    """An env_call request's blob, decoded (info_codec: msgpack and numpy
    arrays, never pickle) and checked: {"op": "call", "name", "args",
    "kwargs"} or {"op": "set_attr", "name", "values": one per env}.  Its size
    and the objects it decodes to are bounded before they are built
    (MAX_REQUEST_BYTES, MAX_CALL_OBJECTS, info_codec.MAX_EXT_DEPTH), and a
    name with a leading underscore (private and special attributes, e.g.
    __class__) is refused: a client reaches the envs' public API only."""
    if len(blob) > MAX_REQUEST_BYTES:
        raise protocol.BadRequest(f"env_call: the request is {len(blob)} bytes, over the "
                                  f"{MAX_REQUEST_BYTES}-byte bound")
    try:
        request = info_codec.decode(blob, max_objects=MAX_CALL_OBJECTS)
    except Exception as exc:  # noqa: BLE001 -- whatever a malformed blob raises
        raise protocol.BadRequest(f"env_call: the request does not decode ({exc})") from None
    if not isinstance(request, dict) or request.get("op") not in ("call", "set_attr") \
            or not isinstance(request.get("name"), str):
        raise protocol.BadRequest("env_call: the request is {op: call|set_attr, name: str, ...}")
    if request["name"].startswith("_"):
        raise protocol.BadRequest(f"env_call: {request['name'][:100]!r} is private to the env "
                                  "(a leading underscore): the daemon serves public "
                                  "attributes only")
    if request["op"] == "call":
        args, kwargs = request.get("args", []), request.get("kwargs", {})
        if not isinstance(args, list) or not isinstance(kwargs, dict) \
                or not all(isinstance(k, str) for k in kwargs):
            raise protocol.BadRequest("env_call: call's args is a list, kwargs a map of str")
        return {"op": "call", "name": request["name"], "args": args, "kwargs": kwargs}
    values = request.get("values")
    if not isinstance(values, list) or len(values) != num_envs:
        raise protocol.BadRequest(f"env_call: set_attr's values is a list of {num_envs} "
                                  "values, one per env")
    return {"op": "set_attr", "name": request["name"], "values": values}
