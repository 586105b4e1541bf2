"""The stepping handlers (reset, async reset, step, send, recv, fast, render):
a thin front door over the native request engine (envd.native.request_engine).

Each handler checks the request, writes its inputs into the session's buffers
and submits it to the engine, which keeps what waits, in C, one request per
session (a session takes one request at a time, server/lifecycle.py) and
decides each under its session's lock:
  - a sync step, answered at once when it ran inline, else by the completion
    a pool event (the pool's eventfd; a hosted worker's pidfd) drains;
  - a recv, answered at once when enough sent envs are ready, else parked in
    the engine until they are (sends of its session are served meanwhile: a
    client driving several daemons keeps one recv waiting on each while it
    sends, client/multi_async.py; a batch such a send runs inline may
    complete it at once);
  - a settle of a closed session whose batches are still in flight: it is
    freed once they ended.
What this module keeps is what to answer for each tag (the client, the
request id, whether the reply carries the outputs): nothing about envs or
batches.  Reset (and async reset, which waits for the batches in flight)
and render run on the Service's executor and reply from its callback.
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
from envd.native import request_engine
from envd.native.hosted_calls import MAX_CALL_OBJECTS, MAX_REQUEST_BYTES
from envd.native.request_engine import Completion, RequestEngine
from envd.server.fair_ops import Done
from envd.server.hosted import HostedServerSession
from envd.server.lifecycle import State
from envd.server.sessions import ClientRecord, Session, async_in_flight

if TYPE_CHECKING:
    from envd.server.service import Service

log = logging.getLogger("envd.server")

Handler = Callable[[ClientRecord, dict[str, Any], list[bytes]], "dict | None"]


class Waiting(NamedTuple):
    """What to answer when a request the engine keeps completes."""
    session: Session
    identity: bytes
    request_id: int
    inline: bool                # the reply carries the outputs as data frames
    started: float              # a step's perf_counter at submit (the latency metric)
    ids: np.ndarray | None      # a recv's ids, written by the engine
    least: int                  # a recv's min (its refusal's wording)


class SteppingHandlers:
    """reset, step, send, recv, fast and render for one Service."""

    def __init__(self, service: Service):
        self.service = service
        self.config = service.config
        self.engine = RequestEngine()
        self._waiting: dict[int, Waiting] = {}  # by tag: what to answer when it completes
        self._tags = 0
        self.fast_path_sessions = 0  # sessions whose doorbell a doorbell thread serves

    def handlers(self) -> dict[str, Handler]:
        return {"reset": self.reset, "step": self.step, "send": self.send,
                "recv": self.recv, "fast": self.fast, "render": self.render,
                "env_call": self.env_call}

    @property
    def idle(self) -> bool:
        """No request waits in the engine and no socket session has a batch in
        flight."""
        return not self.engine.waiting() and not any(
            self._in_flight(s) for s in self.service.sessions.values())

    @property
    def sessions_stepping(self) -> int:
        """Sessions with a sync step or async batches on the pool now."""
        return self.engine.waiting(request_engine.STEP) + sum(
            self._in_flight(s) for s in self.service.sessions.values())

    @staticmethod
    def _in_flight(session: Session) -> bool:
        """Envs sent over the socket are in flight (or, when another thread
        holds the session's lock, an executor operation runs: busy all the
        same).  Never waits for the lock."""
        return not session.fast_path and not session.life.freed and session.in_flight_or_held()

    def forget(self, session: Session) -> None:
        """The session is being freed: a request of it that waits in the
        engine (at shutdown only: a session is freed when none runs) is
        dropped, never completed."""
        native = session.native_if_alive
        if native is not None and self.engine.forget(native.handle):
            for tag, waiting in list(self._waiting.items()):
                if waiting.session is session:
                    del self._waiting[tag]

    def forget_all(self) -> None:
        """At shutdown, once every session was freed: nothing waits any more."""
        self._waiting.clear()

    def _tag(self) -> int:
        self._tags += 1
        return self._tags

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
        self.settle_later(session)
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
        tag = self._tag()
        done = self.engine.step(session.native.handle, tag)
        if done is not None and done.refused:  # envs in flight or ready, ...: nothing ran
            session.native.step_result(done.result, done.error_index)
        session.segment.bump_step_seq()
        waiting = Waiting(session, client.identity, header["id"], inline, started, None, 0)
        if done is not None:  # ran inline: no eventfd event comes
            return self._step_reply(waiting, done)
        session.life.begin("step")
        self._waiting[tag] = waiting
        return None

    def _step_reply(self, waiting: Waiting, done: Completion) -> dict:
        session, request_id = waiting.session, waiting.request_id
        session.segment.bump_done_seq()  # failed or not, the buffers are free again
        self.service.step_latency(time.perf_counter() - waiting.started)
        try:
            num_done = session.native.step_result(done.result, done.error_index)
        except EnvdError as exc:
            return protocol.error_reply(request_id, exc)
        self.count_steps(session)
        if session.revoked:  # its results went to zero pages
            return self.service.revoked_reply(session, request_id)
        reply = protocol.ok_reply(request_id, num_done=num_done)
        if waiting.inline:
            reply.update(session.outputs())
        return reply

    # ---- async send and recv ------------------------------------------------------------------
    def send(self, client: ClientRecord, header: dict[str, Any], blobs: list[bytes]) -> dict:
        # (served beside a parked recv: the native session's books take the
        # batch as any other; the engine looks at the recv after it)
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
        rc, index, done = self.engine.send(session.native.handle, env_ids)
        if done is not None:  # the batch ran inline and completed the parked recv
            self._complete(done)
        if rc != 0:
            raise session.native.send_error(rc, index)
        return protocol.ok_reply(header["id"])

    def recv(self, client: ClientRecord, header: dict[str, Any], blobs: list[bytes]) -> dict | None:
        session = self.service.session_for(client, header)
        self._check_not_fast_path(session, "recv")
        count = check_int("count", header["count"], 1, session.num_envs)
        least = check_int("min", header.get("min", count), 1, count)
        ids = np.empty(count, np.int64)
        tag = self._tag()
        waiting = Waiting(session, client.identity, header["id"], header.get("inline", False),
                          0.0, ids, least)
        done = self.engine.recv(session.native.handle, least, count, ids, tag)
        if done is not None:  # enough ready, or refused (raises: too few sent, an env's failure)
            return self._recv_reply(waiting, done)
        session.life.begin("recv")
        self._waiting[tag] = waiting
        return None

    def _recv_reply(self, waiting: Waiting, done: Completion) -> dict:
        """The reply to a recv that completed (raises its error)."""
        session, request_id = waiting.session, waiting.request_id
        if done.result < 0:
            raise session.native.recv_error(done.result, waiting.least, done.error_index)
        assert waiting.ids is not None
        ids = waiting.ids[:done.result]
        if session.revoked:  # their results went to zero pages
            return self.service.revoked_reply(session, request_id)
        self.count_steps(session)
        if not waiting.inline:
            return protocol.ok_reply(request_id, _blobs=[ids.tobytes()])
        outputs = session.outputs(ids)
        return protocol.ok_reply(request_id, arrays=outputs["arrays"],
                                 _blobs=[ids.tobytes(), *outputs["_blobs"]])

    # ---- completion ---------------------------------------------------------------------------
    def on_pool_event(self) -> None:
        """Answer every request the engine completed since the last look."""
        for done in self.engine.poll():
            # The engine hands each completion over once: one that fails to
            # be answered (a bug) must not cost the ones after it theirs.
            try:
                self._complete(done)
            except Exception:  # logged; the loop goes on
                log.exception("internal error while answering a completed request")

    def _complete(self, done: Completion) -> None:
        """Answer a waiting request that completed (exactly once: its tag
        leaves the books), or free the closed session a settle waited for."""
        waiting = self._waiting.pop(done.tag)
        session = waiting.session
        if done.kind == request_engine.SETTLE:
            session.life.settle()
            return
        try:
            if done.kind == request_engine.STEP:
                reply = self._step_reply(waiting, done)
            else:
                reply = self._recv_reply(waiting, done)
        except EnvdError as exc:  # a recv's: an env failed, the parked recv reports it
            reply = protocol.error_reply(waiting.request_id, exc)
        except Exception:  # a bug: still answer, and free the session's turn
            log.exception("internal error while answering a completed request")
            reply = protocol.error_reply(waiting.request_id, DaemonError(
                "internal error in the daemon; its log has the details"))
        session.life.end()
        self.settle_later(session)
        self.service.send(waiting.identity, reply)

    def settle_later(self, session: Session) -> None:
        """A closed session whose batches are still in flight is freed once
        they ended (freeing would wait for them on the loop): the engine
        waits for that (a settle request), and its completion frees it."""
        life = session.life
        if life.state is not State.CLOSING or life.operation is not None:
            return
        tag = self._tag()
        if self.engine.settle(session.native.handle, tag) is not None:
            life.settle()
        else:
            self._waiting[tag] = Waiting(session, b"", 0, False, 0.0, None, 0)

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
