"""The daemon's request handling: clients, sessions, leases, one handler per message type.

The Service knows nothing of sockets: the daemon hands it each request's
frames with the sender's identity and gives it a ``send(identity, reply)``
callable.  Everything here runs on the event loop thread and never blocks on
env work:
  - step: submitted to the native pool; its reply goes out when the pool's
    eventfd says the step finished (on_pool_event), or at once when the vec
    ran it inline because it was cheap;
  - make and reset: run on a small executor (cffi releases the GIL), reply
    from the future's callback;
  - everything else is bookkeeping and replies at once.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import math
import os
import secrets
import socket
import time
from concurrent.futures import Executor, Future
from typing import Any, Callable

import numpy as np

from envd import __version__, protocol
from envd.errors import (ConnectionLostError, DaemonError, EnvdError, EnvStateError,
                         LimitExceededError, SessionExpiredError, SharedMemoryError,
                         ShuttingDownError, UnknownEnvError, UnknownSessionError)
from envd.native import segment_guard
from envd.native.native_vec import MAX_NUM_ENVS, NativePool
from envd.native.registry import get_spec, list_envs
from envd.native.vector_env import check_max_episode_steps
from envd.vector_base import check_int, parse_autoreset_mode, seed_list
from envd.server.config import Config
from envd.server.replies import ReplyBooks, is_small
from envd.server.sessions import (ClientRecord, Session, async_in_flight, segment_plan,
                                  state_plan)

log = logging.getLogger("envd.server")

#: The daemon's transport: send(identity, reply) puts the reply (its packed
#: header under "_header", data frames under "_blobs") on the peer's queue;
#: False when that queue is full (the peer reads no replies).
Send = Callable[[bytes, dict[str, Any]], bool]
#: How many expired session / client ids the daemon remembers, to answer
#: "expired" rather than "unknown" (bounded: a long-lived daemon must not grow).
_EXPIRED_MEMORY = 65536
#: Requests a draining daemon still serves.
_DRAIN_ALLOWED = {"hello", "close", "bye", "heartbeat", "status"}
#: Longest env id / message type echoed back in an error message.
_ECHO_LIMIT = 100
#: A make request's fields besides the env kwargs: a kwarg close to one of
#: them (sed=0) is suggested as that argument in the error.
_MAKE_ARGUMENTS = tuple(f for f in protocol.MESSAGE_FIELDS["make"] if f != "env_kwargs")
#: Requests --max-requests-per-second never refuses: a throttled client can
#: always keep its lease and leave.
_NEVER_THROTTLED = frozenset({"heartbeat", "close", "bye"})


def _without_blobs(reply: dict[str, Any]) -> dict[str, Any]:
    """A reply's header fields (its data frames go after the header)."""
    return {k: v for k, v in reply.items() if k != "_blobs"}


class Service:
    """Clients, their sessions and the handlers of every message type."""

    def __init__(self, config: Config, pool: NativePool, executor: Executor, send: Send,
                 segment_prefix: str, plugins: list[dict[str, Any]] | None = None,
                 step_latency: Callable[[float], None] | None = None):
        self.config = config
        self.plugins = list(plugins or ())  # what load_plugins reported, for status
        self.segment_prefix = segment_prefix
        self.pool = pool
        self.executor = executor
        self._transmit = send
        self.replies = ReplyBooks(config.reply_bytes_per_client, config.reply_bytes_total)
        self.dropped_clients = 0  # clients dropped for leaving their replies unread
        self.clients: dict[bytes, ClientRecord] = {}
        self.sessions: dict[str, Session] = {}
        self.draining = False
        self.started = time.time()
        self.env_steps = 0
        # For the metrics (server/metrics.py reads them at scrape time):
        self.env_steps_by_env: collections.Counter[str] = collections.Counter()
        self.closed_session_jobs = [0, 0]  # inline, pooled step jobs of closed sessions
        self.lease_expiries = 0            # clients whose lease expired
        self.lease_expired_sessions = 0    # sessions freed by those expiries
        # seconds from a sync step's submit to its reply (a no-op without metrics)
        self._step_latency = step_latency or (lambda seconds: None)
        # session -> (identity, request id, submit time, inline) of its step on the pool
        self._pending_steps: dict[Session, tuple[bytes, int, float]] = {}
        self._async_sessions: set[Session] = set()  # with batches in flight
        self._running_ops = 0        # makes and resets on the executor
        self._unclaimed: set[Session] = set()  # made, but the make's reply not sent yet
        self._reserved_sessions = 0  # makes in flight count against max_sessions
        self._shm_in_use = 0         # bytes of the segments of sessions not freed yet
        self._fast_sessions = 0      # sessions with a fast-path thread
        self._reserved_shm = 0       # bytes of the segments of makes in flight
        self._state_in_use = 0       # heap bytes (state_plan) of sessions not freed yet
        self._reserved_state = 0     # heap bytes of makes in flight
        self._rate = config.max_requests_per_second  # 0: unlimited
        self._burst = config.request_burst
        self._expired_sessions: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._expired_clients: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        # Sessions closed because a client truncated their segment (answered
        # with that reason, not "unknown"), and the guard's revocation count
        # when the sessions were last looked at.
        self._revoked_sessions: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._revocations_seen = segment_guard.revocations()
        self._handlers = {"hello": self._hello, "heartbeat": self._heartbeat,
                          "list_envs": self._list_envs, "status": self._status,
                          "make": self._make, "reset": self._reset, "step": self._step,
                          "send": self._send_batch, "recv": self._recv, "fast": self._fast,
                          "render": self._render, "close": self._close, "bye": self._bye}

    # ---- dispatch -------------------------------------------------------------------------
    def handle(self, identity: bytes, frames: list[bytes]) -> None:
        """Answer one request (frames after the routing id): header, then blobs."""
        request_id, kind = None, "?"
        try:
            if not frames:
                raise protocol.BadRequest("an empty message has no header frame")
            size = sum(map(len, frames))
            if size > self.config.max_message_bytes:
                raise LimitExceededError(
                    f"a message of {size} bytes is over the daemon's limit of "
                    f"{self.config.max_message_bytes} (--max-message-bytes)")
            header = protocol.unpack(frames[0], self.config.max_message_bytes)
            if isinstance(header.get("id"), int) and not isinstance(header.get("id"), bool):
                request_id = header["id"]
            kind = protocol.validate_request(header, len(frames) - 1)
            dropped = self.replies.dropped(identity)
            if dropped is not None:
                raise ConnectionLostError(dropped)
            if self.draining and kind not in _DRAIN_ALLOWED:
                raise ShuttingDownError("the daemon is shutting down and takes no new work")
            client = self._client_for(identity, kind, header)
            if client.identity == identity:  # not a heartbeat naming another connection
                self._check_unread_replies(identity, kind, header)
            if (self._rate and kind not in _NEVER_THROTTLED
                    and not client.take_token(self._rate, self._burst)):
                raise self._throttled(client, kind)
            reply = self._handlers[kind](client, header, frames[1:])
        except EnvdError as exc:
            reply = protocol.error_reply(request_id, exc)
        except Exception:  # a bug: log it here, send no traceback
            log.exception("internal error while handling a %s request", kind)
            reply = protocol.error_reply(request_id, DaemonError(
                f"internal error while handling {kind!r}; the daemon's log has the details"))
        if reply is not None:
            self.send(identity, reply)

    def _check_unread_replies(self, identity: bytes, kind: str, header: dict[str, Any]) -> None:
        """Take in the request's receipt ("ack"); refuse it while the
        connection (or the daemon) holds too many bytes of unread replies."""
        if "ack" in header:
            self.replies.acknowledge(identity, header["ack"])
        self.replies.seen(identity)
        if kind not in _NEVER_THROTTLED:  # a client over its budget can always leave
            refusal = self.replies.refusal(identity)
            if refusal is not None:
                raise LimitExceededError(refusal)

    def send(self, identity: bytes, reply: dict[str, Any]) -> None:
        """Send one reply, keeping the books of unread replies (server/replies.py):
        a large reply gets a token, or is replaced by a small error when the
        connection or the daemon is over its budget; a client whose queue is
        full (it reads no replies) is dropped."""
        blobs = reply.get("_blobs", ())
        header = protocol.pack(_without_blobs(reply) if blobs else reply)
        size = len(header) + sum(b.nbytes if hasattr(b, "nbytes") else len(b) for b in blobs)
        if not is_small(size):
            token = (self.replies.admit(identity, size) if identity in self.clients else
                     "this connection is no longer a client (bye, lease expired, or dropped)")
            if isinstance(token, str):
                log.warning("withheld a reply of %d bytes: %s", size, token, extra={
                    "event": "reply_withheld", "client": identity.hex()[:8],
                    "request_id": reply.get("id")})
                reply = protocol.error_reply(reply.get("id"), LimitExceededError(
                    f"the request ran, but {token}; its results were not sent. Read and "
                    "acknowledge your replies (docs/protocol.md), or ask the operator to "
                    "raise the limit"))
                header = protocol.pack(reply)
            else:
                reply = {**reply, "token": token}
                header = protocol.pack(_without_blobs(reply))
        reply["_header"] = header
        if not self._transmit(identity, reply) and identity in self.clients:
            self.drop_unreadable(self.clients[identity])

    def drop_unreadable(self, client: ClientRecord) -> None:
        """Drop a client that reads no replies: its queue in the daemon is
        full.  Its sessions are freed, its books forgotten, and every later
        request from its connection gets connection_lost."""
        log.warning("dropped a client that does not read its replies (%d queued in the "
                    "daemon, or %d bytes not acknowledged): freeing %d session(s)",
                    protocol.REPLY_QUEUE, self.replies.unread_bytes(client.identity),
                    len(client.sessions), extra={"event": "client_dropped",
                                                 "client": client.identity.hex()[:8]})
        self.dropped_clients += 1
        self.replies.drop(client.identity, (
            "the daemon dropped this connection because it did not read its replies (its "
            f"queue of {protocol.REPLY_QUEUE} replies was full, or its unread replies were "
            "not acknowledged for a lease timeout) and freed its sessions; connect again "
            "and read every reply"))
        for session in list(client.sessions.values()):
            self._remember(self._expired_sessions, session.id)
            self._drop(session, "dropped (replies unread)")
        self.clients.pop(client.identity, None)

    def _throttled(self, client: ClientRecord, kind: str) -> LimitExceededError:
        wait_ms = max(1, round(1000 * client.token_wait(self._rate)))
        return LimitExceededError(
            f"this client sends requests faster than the daemon's limit of {self._rate} per "
            f"second (--max-requests-per-second {self._rate}, bursts of {self._burst}); this "
            f"{kind} request was refused and not executed. Back off: retry in {wait_ms} ms or "
            f"later and send at most {self._rate} requests per second (heartbeat, close and "
            "bye are never throttled)")

    def _client_for(self, identity: bytes, kind: str, header: dict[str, Any]) -> ClientRecord:
        if kind == "hello":
            if header["version"] != protocol.PROTOCOL_VERSION:
                raise protocol.BadRequest(
                    f"this daemon speaks protocol version {protocol.PROTOCOL_VERSION}, the "
                    f"client {header['version']}; install matching envd versions",
                    "unsupported_version")
            client = self.clients.get(identity) or ClientRecord(identity)
            self.clients[identity] = client
        elif kind == "heartbeat" and "client" in header:
            client = self.clients.get(header["client"])
            if client is None:
                raise (SessionExpiredError("this client's lease expired")
                       if header["client"] in self._expired_clients
                       else UnknownSessionError("no client with this id is connected"))
        else:
            client = self.clients.get(identity)
            if client is None and identity in self._expired_clients:
                # A client whose lease expired comes back: it may make new envs;
                # requests for its old sessions are answered "session_expired".
                client = self.clients[identity] = ClientRecord(identity)
            if client is None:
                raise protocol.BadRequest(f"send hello before {kind!r}")
        client.touch()
        return client

    def _session(self, client: ClientRecord, header: dict[str, Any]) -> Session:
        session_id = header["session"]
        self.close_revoked_sessions()
        if session_id in self._revoked_sessions:
            raise self._revoked_error(session_id)
        session = client.sessions.get(session_id)
        if session is None and session_id in self._expired_sessions:
            raise SessionExpiredError(
                f"session {session_id} expired: its client sent nothing for more than "
                f"{self.config.lease_timeout:g} s (the lease timeout), so the daemon freed "
                "its envs; make a new env")
        if session is None:
            raise UnknownSessionError(
                f"no session {session_id!r} on this connection (closed, or made by another client)")
        if session.busy:
            raise EnvStateError(f"session {session_id} is busy: a session takes one request at "
                                "a time and a reset or step is still running")
        return session

    # ---- handlers --------------------------------------------------------------------------
    def _hello(self, client: ClientRecord, header: dict[str, Any], blobs: list[bytes]) -> dict:
        client.name = header.get("client_name", "")[:200]
        # limits also stay at the top level for clients older than capabilities
        from envd.server.capabilities import hello_capabilities
        return protocol.ok_reply(
            header["id"], version=protocol.PROTOCOL_VERSION, server=f"envd {__version__}",
            pid=os.getpid(), hostname=socket.gethostname(),
            lease_timeout=self.config.lease_timeout,
            heartbeat_interval=self.config.heartbeat_interval, limits=self._limits(),
            capabilities=hello_capabilities(self.config, self._limits()))

    def _heartbeat(self, client: ClientRecord, header: dict[str, Any], blobs: list[bytes]) -> dict:
        return protocol.ok_reply(header["id"])

    def _list_envs(self, client: ClientRecord, header: dict[str, Any], blobs: list[bytes]) -> dict:
        envs = []
        for env_id in list_envs():
            spec = get_spec(env_id)
            envs.append({"id": env_id,
                         "observation_space": protocol.space_to_wire(spec.observation_space),
                         "action_space": protocol.space_to_wire(spec.action_space),
                         "max_episode_steps": spec.max_episode_steps,
                         "params": [{"name": p.name, "type": p.type, "default": p.default,
                                     "min": p.min_value, "max": p.max_value, "doc": p.doc}
                                    for p in spec.params],
                         "info_fields": [{"name": f.name, "dtype": f.dtype.name,
                                          "shape": list(f.shape), "doc": f.doc}
                                         for f in spec.info_fields],
                         "origin": spec.origin})
        return protocol.ok_reply(header["id"], envs=envs)

    def _status(self, client: ClientRecord, header: dict[str, Any], blobs: list[bytes]) -> dict:
        return protocol.ok_reply(header["id"], **self.status())

    def _make(self, client: ClientRecord, header: dict[str, Any], blobs: list[bytes]) -> None:
        self.close_revoked_sessions()  # a truncated session must not count against the limits
        if len(header["env_id"]) > _ECHO_LIMIT:
            raise UnknownEnvError(
                f"unknown env id of {len(header['env_id'])} characters; known ids: "
                f"{', '.join(list_envs())}")
        spec = get_spec(header["env_id"])
        num_envs = check_int("num_envs", header["num_envs"], 1, MAX_NUM_ENVS)
        if len(self.sessions) + self._reserved_sessions >= self.config.max_sessions:
            raise LimitExceededError(
                f"the daemon holds its maximum of {self.config.max_sessions} sessions "
                "(--max-sessions); close envs you no longer use")
        held_sessions = len(client.sessions) + client.reserved_sessions
        if held_sessions >= self.config.max_sessions_per_client:
            raise LimitExceededError(
                f"this client holds {held_sessions} sessions, the daemon's maximum of "
                f"{self.config.max_sessions_per_client} sessions per client "
                "(--max-sessions-per-client); close envs you no longer use")
        held = client.num_envs + client.reserved_envs
        if held + num_envs > self.config.max_envs_per_client:
            raise LimitExceededError(
                f"making {num_envs} more envs would give this client {held + num_envs}, over "
                f"the daemon's limit of {self.config.max_envs_per_client} envs per client "
                "(--max-envs-per-client)")
        batch_size = header.get("batch_size")
        if batch_size is not None:
            batch_size = check_int("batch_size", batch_size, 1, num_envs)
        mode = parse_autoreset_mode(header.get("autoreset_mode", "next_step"))
        max_steps = check_max_episode_steps(spec, header.get("max_episode_steps"))
        segment_bytes = segment_plan(spec, num_envs, mode)[1]  # refused before it exists
        in_use = self.shm_bytes
        if in_use + segment_bytes > self.config.max_shm_bytes:
            raise LimitExceededError(
                f"making {num_envs} {spec.id} envs needs a shared-memory segment of "
                f"{segment_bytes} bytes; with the {in_use} bytes the daemon's sessions hold "
                f"that is {in_use + segment_bytes}, over its limit of "
                f"{self.config.max_shm_bytes} bytes (--max-shm-bytes); close envs you no "
                "longer use or make fewer")
        state_bytes = state_plan(spec, num_envs)  # refused before anything is allocated
        in_use = self.state_bytes
        if in_use + state_bytes > self.config.max_state_bytes:
            over = in_use + state_bytes - self.config.max_state_bytes
            raise LimitExceededError(
                f"making {num_envs} {spec.id} envs needs {state_bytes} bytes of env state "
                f"(state_size {spec.definition.state_size} bytes per env, plus per-env "
                f"bookkeeping); with the {in_use} bytes the daemon's sessions hold that is "
                f"{in_use + state_bytes}, {over} bytes over its limit of "
                f"{self.config.max_state_bytes} bytes (--max-state-bytes); close envs you no "
                "longer use or make fewer")
        if self.fd_check is not None:  # the session's fds must not eat the daemon's reserve
            self.fd_check(self._reserved_sessions)
        render_mode = spec.check_render_mode(header.get("render_mode"))
        env_kwargs = header.get("env_kwargs", {})
        seed = header.get("seed")

        def build() -> Session:  # on the executor: seeds and envs of big makes take time
            params = spec.param_values(env_kwargs, _MAKE_ARGUMENTS)
            seeds = seed_list(secrets.randbelow(2**63) if seed is None else seed, num_envs)
            try:
                session = Session(client.identity, spec, num_envs, mode, max_steps, params,
                                  seeds, self.pool, self.segment_prefix)
            except (OSError, MemoryError) as exc:  # /dev/shm or the heap is full
                raise LimitExceededError(
                    f"cannot allocate {num_envs} {spec.id} envs: {exc}; the host's shared "
                    "memory (/dev/shm; in a container see --shm-size) or memory is exhausted"
                ) from None
            session.batch_size = batch_size or num_envs
            session.render_mode = render_mode
            self._unclaimed.add(session)  # set.add is atomic: shutdown frees it if need be
            return session

        self._reserved_sessions += 1
        client.reserved_sessions += 1
        client.reserved_envs += num_envs
        self._reserved_shm += segment_bytes
        self._reserved_state += state_bytes
        self._running_ops += 1

        def done(future: Future) -> None:
            self._running_ops -= 1
            self._reserved_sessions -= 1
            client.reserved_sessions -= 1
            client.reserved_envs -= num_envs
            self._reserved_shm -= segment_bytes
            self._reserved_state -= state_bytes
            reply = self._result_reply(header["id"], future)
            session = future.result() if reply["ok"] else None
            self._unclaimed.discard(session)
            if session is not None:
                self._shm_in_use += session.segment_bytes
                self._state_in_use += session.state_bytes
            if session is not None and (self.draining or self.clients.get(client.identity) is not client):
                self._free(session)  # the client expired or the daemon drains meanwhile
                reply = protocol.error_reply(header["id"], ShuttingDownError(
                    "the daemon is shutting down") if self.draining else SessionExpiredError(
                    "the client left (bye) or its lease expired while its env was being made"))
            elif session is not None and session.revoked:
                self._free(session)  # truncated before its client even knew its name
                reply = protocol.error_reply(header["id"], SharedMemoryError(
                    f"making {num_envs} {spec.id} envs failed: a process truncated the new "
                    f"session's shared-memory segment {session.segment.path} while the daemon "
                    "set it up; nothing may resize a session's segment"))
            elif session is not None:
                self.sessions[session.id] = client.sessions[session.id] = session
                reply.update(session.describe())
                log.info("session opened: %d x %s", num_envs, spec.id, extra={
                    "event": "session_open", "client": client.identity.hex()[:8],
                    "request_id": header["id"], "session": session.id[:8],
                    "env_id": spec.id, "num_envs": num_envs})
            self.send(client.identity, reply)
            self._check_drained()

        self._submit(build, done)
        return None

    def _reset(self, client: ClientRecord, header: dict[str, Any], blobs: list[bytes]) -> None:
        session = self._session(client, header)
        self._check_no_async(session, "reset")
        with_seeds, with_mask = header.get("seeds", False), header.get("mask", False)
        inline = header.get("inline", False)
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
        # (a mask selecting no env is refused by the vec, on its private copy)
        session.busy = True
        session.segment.bump_step_seq()  # the counters cover resets too
        self._running_ops += 1

        def done(future: Future) -> None:
            self._running_ops -= 1
            session.segment.bump_done_seq()
            reply = self._result_reply(header["id"], future)
            if session.revoked:
                reply = self._revoked_reply(session, header["id"])
            if inline and reply["ok"] and session.buffers is not None:
                reply.update(session.outputs())
            self._operation_ended(session)
            self.send(client.identity, reply)
            self._check_drained()

        self._submit(lambda: session.reset(with_seeds, with_mask), done)
        return None

    def _step(self, client: ClientRecord, header: dict[str, Any], blobs: list[bytes]) -> dict | None:
        session = self._session(client, header)
        self._check_not_fast(session, "step")
        self._check_no_async(session, "step")
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
        session.native.step_submit()
        session.segment.bump_step_seq()
        if session.native.step_done():  # ran inline: no eventfd event comes
            reply = self._finish_step(session, header["id"], inline)
            self._step_latency(time.perf_counter() - started)
            return reply
        session.busy = True
        self._pending_steps[session] = (client.identity, header["id"], started, inline)
        return None

    def _render(self, client: ClientRecord, header: dict[str, Any], blobs: list[bytes]) -> None:
        """Draw every env's frame on the executor; the reply carries them in one
        data frame, so a render of more bytes than --max-message-bytes is refused
        before anything is drawn (and the reply counts against the unread-reply
        budgets like any large reply)."""
        session = self._session(client, header)
        self._check_no_async(session, "render")
        if session.render_mode is None:
            raise EnvStateError(
                f"session {session.id} ({session.spec.id}) was made without a render mode; "
                "make it with render_mode='rgb_array' to render")
        shape = (session.num_envs,) + session.spec.render_shape
        size = math.prod(shape)
        if size > self.config.max_message_bytes:
            height, width, _ = session.spec.render_shape
            raise LimitExceededError(
                f"rendering {session.num_envs} {session.spec.id} envs makes {size} bytes of "
                f"frames ({height}x{width}x3 each), over the daemon's message limit of "
                f"{self.config.max_message_bytes} bytes (--max-message-bytes); render a "
                f"session of at most {self.config.max_message_bytes // (size // shape[0])} "
                "envs, or ask the operator to raise the limit")
        session.busy = True
        self._running_ops += 1

        def done(future: Future) -> None:
            self._running_ops -= 1
            reply = self._result_reply(header["id"], future)
            if session.revoked:
                reply = self._revoked_reply(session, header["id"])
            elif reply["ok"]:
                reply.update(frames={"dtype": "uint8", "shape": list(shape)},
                             _blobs=[memoryview(future.result()).cast("B")])
            self._operation_ended(session)
            self.send(client.identity, reply)
            self._check_drained()

        self._submit(session.render, done)
        return None

    @staticmethod
    def _check_not_fast(session: Session, call: str) -> None:
        # The fast path's thread steps the vec whenever the doorbell rings: a
        # step of the event loop beside it would race it.
        if session.fast is not None:
            raise EnvStateError(f"{call} over the socket on session {session.id}, whose steps "
                                "the fast path serves (its doorbell in shared memory)")

    def _fast(self, client: ClientRecord, header: dict[str, Any], blobs: list[bytes]) -> dict:
        """Serve the session's steps, sends and recvs from the doorbell in its
        header page."""
        session = self._session(client, header)
        if not header.get("enable", True):
            if session.fast is not None:
                session.fast.lock()
                try:
                    session.check_no_fast_async("turning the fast path off")
                finally:
                    session.fast.unlock()
                self._stop_fast(session)
            return protocol.ok_reply(header["id"])
        if session.fast is None:
            if self._fast_sessions >= self.config.fast_path_sessions:
                raise LimitExceededError(
                    f"the daemon serves its maximum of {self.config.fast_path_sessions} "
                    "fast-path sessions (--fast-path-sessions); this session steps over "
                    "the socket")
            self._check_no_async(session, "the fast path")
            session.start_fast(self.config.fast_path_spin_us * 1000)
            self._fast_sessions += 1
            if self.draining:
                session.fast.drain()
        return protocol.ok_reply(header["id"], doorbell={"offset": protocol.DOORBELL_OFFSET})

    def collect_fast_steps(self) -> None:
        """Count the env steps the fast-path threads served since last time
        (for status and metrics, at most a lease tick late)."""
        for session in self.sessions.values():
            if session.fast is not None:
                self._count_fast_steps(session)

    def _count_fast_steps(self, session: Session) -> None:
        steps, env_steps = session.new_fast_steps()
        session.steps += steps
        session.env_steps += env_steps
        self._count_steps(session, env_steps)

    @staticmethod
    def _check_no_async(session: Session, call: str) -> None:
        if session.batches or session.num_ready:
            raise async_in_flight(call)

    def _send_batch(self, client: ClientRecord, header: dict[str, Any], blobs: list[bytes]) -> dict:
        session = self._session(client, header)
        self._check_not_fast(session, "send")
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
        self._count_steps(session, session.submit(env_ids))
        if session.batches:
            self._async_sessions.add(session)
        return protocol.ok_reply(header["id"])

    def _recv(self, client: ClientRecord, header: dict[str, Any], blobs: list[bytes]) -> dict | None:
        session = self._session(client, header)
        self._check_not_fast(session, "recv")
        count = check_int("count", header["count"], 1, session.num_envs)
        self._count_steps(session, session.collect())
        error = session.take_batch_error()
        if error is not None:  # its envs stay ready: the next recv returns them
            raise error
        pending = session.num_ready + session.batches.num_envs()
        if pending < count:
            raise EnvStateError(f"recv of {count} envs, but only {pending} were sent and not "
                                "reported yet; send more first")
        inline = header.get("inline", False)
        if session.num_ready >= count:
            return self._recv_reply(session, header["id"], inline)
        session.busy = True
        session.recv_waiter = (client.identity, header["id"], count, inline)
        return None

    def _recv_reply(self, session: Session, request_id: int, inline: bool) -> dict:
        if session.revoked:
            return self._revoked_reply(session, request_id)
        ids = session.take_ready()
        if not inline:
            return protocol.ok_reply(request_id, _blobs=[ids.tobytes()])
        outputs = session.outputs(ids)
        return protocol.ok_reply(request_id, arrays=outputs["arrays"],
                                 _blobs=[ids.tobytes(), *outputs["_blobs"]])

    def _close(self, client: ClientRecord, header: dict[str, Any], blobs: list[bytes]) -> dict:
        session_id = header["session"]
        session = client.sessions.get(session_id)
        if (session is None and session_id not in self._expired_sessions
                and session_id not in self._revoked_sessions):  # closed already: fine
            raise UnknownSessionError(f"no session {session_id!r} on this connection")
        if session is not None:
            self._drop(session)
        return protocol.ok_reply(header["id"])

    def _bye(self, client: ClientRecord, header: dict[str, Any], blobs: list[bytes]) -> dict:
        for session in list(client.sessions.values()):
            self._drop(session)
        del self.clients[client.identity]
        return protocol.ok_reply(header["id"])

    # ---- completion -------------------------------------------------------------------
    def on_pool_event(self) -> None:
        """The pool's eventfd fired: reply to every submitted step that finished."""
        try:
            os.read(self.pool.eventfd(), 8)
        except BlockingIOError:
            pass
        for session, (identity, request_id, started, inline) in list(self._pending_steps.items()):
            if session.native.step_done():
                del self._pending_steps[session]
                reply = self._finish_step(session, request_id, inline)
                self._operation_ended(session)
                self.send(identity, reply)
                self._step_latency(time.perf_counter() - started)
        for session in list(self._async_sessions):
            self._collect_batches(session)
        self._check_drained()

    def _collect_batches(self, session: Session) -> None:
        """Finished batches of an async session: answer its waiting recv when
        enough envs are ready; free it when it was closed meanwhile."""
        self._count_steps(session, session.collect())
        if not session.batches:
            self._async_sessions.discard(session)
        waiter = session.recv_waiter
        if waiter is not None and (session.batch_error or session.num_ready >= waiter[2]):
            session.recv_waiter = None
            error = session.take_batch_error()  # an env failed: the waiting recv reports it
            reply = (protocol.error_reply(waiter[1], error) if error is not None
                     else self._recv_reply(session, waiter[1], waiter[3]))
            self._operation_ended(session)
            self.send(waiter[0], reply)
        elif session.closing and not session.busy and not session.batches:
            self._free(session)

    def _finish_step(self, session: Session, request_id: int, inline: bool) -> dict:
        session.segment.bump_done_seq()  # failed or not, the buffers are free again
        try:
            num_done = session.native.step_finish()
        except EnvdError as exc:
            return protocol.error_reply(request_id, exc)
        session.steps += 1
        session.env_steps += session.num_envs
        self._count_steps(session, session.num_envs)
        if session.revoked:  # its results went to zero pages
            return self._revoked_reply(session, request_id)
        reply = protocol.ok_reply(request_id, num_done=num_done)
        if inline:
            reply.update(session.outputs())
        return reply

    def _count_steps(self, session: Session, count: int) -> None:
        self.env_steps += count
        self.env_steps_by_env[session.spec.id] += count

    def _submit(self, fn: Callable[[], Any], done: Callable[[Future], None]) -> None:
        """Run fn on the executor; done(future) runs on the event loop thread."""
        asyncio.get_running_loop().run_in_executor(self.executor, fn).add_done_callback(done)

    @staticmethod
    def _result_reply(request_id: int, future: Future) -> dict:
        exc = future.exception()
        if exc is None:
            return protocol.ok_reply(request_id)
        if isinstance(exc, EnvdError):
            return protocol.error_reply(request_id, exc)
        log.error("internal error in an operation", exc_info=exc)
        return protocol.error_reply(request_id, DaemonError(
            "internal error in the daemon; its log has the details"))

    def _operation_ended(self, session: Session) -> None:
        session.busy = False
        if session.closing and not session.batches:
            self._free(session)

    # ---- revoked segments ---------------------------------------------------------------
    def close_revoked_sessions(self) -> None:
        """Close every session whose segment a client truncated (the guard
        revoked the daemon's mapping) since the last look.  Cheap when none
        was: called before each session request and on each lease tick (for
        fast-path sessions, whose requests never reach the loop)."""
        count = segment_guard.revocations()
        if count == self._revocations_seen:
            return
        self._revocations_seen = count
        for session in list(self.sessions.values()):
            if session.revoked:
                self._revoke(session)

    def _revoke(self, session: Session) -> None:
        """Close a session whose segment was truncated (once)."""
        if self.sessions.get(session.id) is not session:
            return
        self._remember(self._revoked_sessions, session.id)
        log.warning("session %s closed: a process truncated its shared-memory segment %s; "
                    "the daemon's mapping was replaced by private memory (no SIGBUS) and the "
                    "session dropped", session.id[:8], session.segment.path, extra={
                        "event": "segment_revoked", "client": session.owner.hex()[:8],
                        "session": session.id[:8], "env_id": session.spec.id})
        if session.fast is not None:  # its client waits on the doorbell in its own
            session.mark_doorbell_closed()  # mapping of the file (removed by _drop)
        self._drop(session, "closed (segment truncated)")

    def _revoked_error(self, session_id: str) -> SharedMemoryError:
        return SharedMemoryError(
            f"session {session_id} was closed: a process truncated (ftruncate) its "
            "shared-memory segment while the daemon used it, so its results are lost. Nothing "
            "may resize a session's segment under /dev/shm; make a new env")

    def _revoked_reply(self, session: Session, request_id: int) -> dict:
        self._revoke(session)
        return protocol.error_reply(request_id, self._revoked_error(session.id))

    # ---- sessions and leases ----------------------------------------------------------
    def _drop(self, session: Session, why: str = "closed") -> None:
        """Forget the session; free it now, or when its running operation ends."""
        log.info("session %s", why, extra={
            "event": "session_close" if why == "closed" else "session_expire",
            "client": session.owner.hex()[:8], "session": session.id[:8],
            "env_id": session.spec.id, "env_steps": session.env_steps})
        self.sessions.pop(session.id, None)
        owner = self.clients.get(session.owner)
        if owner is not None:
            owner.sessions.pop(session.id, None)
        if session.busy or session.batches:
            session.closing = True  # freed when its operation or last batch ends
        else:
            self._free(session)

    def _stop_fast(self, session: Session) -> None:
        """Stop a session's fast path (after the step it serves) and count its steps."""
        session.fast.stop()
        self._count_fast_steps(session)
        self._fast_sessions -= 1
        session.fast = None

    def _free(self, session: Session) -> None:
        """Free a session (once) and give its segment's bytes back.  Its fast
        path is stopped here, not at _drop: an operation on the executor
        (reset, render) holds the fast path's lock until it ends, and
        stopping it under that operation would destroy the lock it holds."""
        if session.fast is not None:  # first: its thread steps the vec (and counts)
            self._stop_fast(session)
        if session.native is not None:  # no step job starts after this: count them now
            stats = session.native.stats()
            self.closed_session_jobs[0] += stats["inline_jobs"]
            self.closed_session_jobs[1] += stats["pooled_jobs"]
        session.free()
        self._shm_in_use -= session.segment_bytes
        self._state_in_use -= session.state_bytes
        session.segment_bytes = session.state_bytes = 0  # counted once even if freed again

    def expire_silent_clients(self) -> None:
        """Free the sessions of every client silent for longer than the lease."""
        now = time.monotonic()
        for client in list(self.clients.values()):
            if now - client.last_seen <= self.config.lease_timeout:
                continue
            if client.sessions:
                log.info("lease expired after %.1f s of silence: freeing %d session(s)",
                         now - client.last_seen, len(client.sessions), extra={
                             "event": "lease_expired", "client": client.identity.hex()[:8]})
            self.lease_expiries += 1
            self.lease_expired_sessions += len(client.sessions)
            for session in list(client.sessions.values()):
                self._remember(self._expired_sessions, session.id)
                self._drop(session, "expired (lease)")
            del self.clients[client.identity]
            self._remember(self._expired_clients, client.identity)
        # Unread replies of a connection that is no client any more and silent
        # for a lease: a peer gone or not reading; its routing id starts no more.
        for identity in self.replies.stale(self.config.lease_timeout):
            # A client whose lease expired keeps its books (a new hello does
            # not empty them) and, coming back, hears session_expired.
            if identity not in self.clients and identity not in self._expired_clients:
                log.warning("dropped connection %s: it left %d bytes of replies unread for "
                            "a lease timeout", identity.hex()[:8],
                            self.replies.unread_bytes(identity),
                            extra={"event": "client_dropped", "client": identity.hex()[:8]})
                self.dropped_clients += 1
                self.replies.drop(identity, (
                    "the daemon dropped this connection because it left replies unread "
                    "(not acknowledged) for a lease timeout; connect again and read every "
                    "reply"))

    @staticmethod
    def _remember(memory: collections.OrderedDict, key: Any) -> None:
        memory[key] = None
        while len(memory) > _EXPIRED_MEMORY:
            memory.popitem(last=False)

    # ---- lifecycle ----------------------------------------------------------------------
    def start_draining(self) -> None:
        self.draining = True
        for session in self.sessions.values():
            if session.fast is not None:
                session.fast.drain()
        self._check_drained()

    def _check_drained(self) -> None:
        if self.draining and self.idle and self.on_drained is not None:
            self.on_drained()

    on_drained: Callable[[], None] | None = None
    #: Set by the daemon: raises LimitExceededError when the file descriptors
    #: left cannot take one more session (argument: makes in flight).
    fd_check: Callable[[int], None] | None = None

    @property
    def idle(self) -> bool:
        """No step, reset or make is running."""
        return not self._pending_steps and self._running_ops == 0 and not self._async_sessions

    def free_all(self) -> None:
        """Free every session at shutdown, once the executor has stopped:
        freeing a vec waits for its step still in flight, if any."""
        for session in [*self.sessions.values(), *self._unclaimed, *self._async_sessions]:
            session.busy = False
            self.sessions.pop(session.id, None)
            session.free()  # waits for batches still in flight
        self._unclaimed.clear()
        self._pending_steps.clear()
        self._async_sessions.clear()

    # ---- status -----------------------------------------------------------------------------
    def _limits(self) -> dict[str, int]:
        return {"max_sessions": self.config.max_sessions,
                "max_envs_per_client": self.config.max_envs_per_client,
                "max_message_bytes": self.config.max_message_bytes,
                "max_sessions_per_client": self.config.max_sessions_per_client,
                "max_shm_bytes": self.config.max_shm_bytes,
                "max_state_bytes": self.config.max_state_bytes,
                "max_requests_per_second": self.config.max_requests_per_second,
                "request_burst": self.config.request_burst,
                "max_reply_bytes_per_client": self.config.reply_bytes_per_client,
                "max_reply_bytes": self.config.reply_bytes_total}

    @property
    def sessions_stepping(self) -> int:
        """Sessions with a sync step or async batches on the pool now."""
        return len(self._pending_steps) + len(self._async_sessions)

    @property
    def shm_bytes(self) -> int:
        """Bytes of shared memory the sessions hold, makes in flight included."""
        return self._shm_in_use + self._reserved_shm

    @property
    def state_bytes(self) -> int:
        """Heap bytes the sessions' env state holds at most (state_plan),
        makes in flight included."""
        return self._state_in_use + self._reserved_state

    def status(self) -> dict[str, Any]:
        """What `envd status` prints: version, load and limits."""
        self.collect_fast_steps()  # the fast path's steps, up to now
        return {"server": f"envd {__version__}", "pid": os.getpid(),
                "hostname": socket.gethostname(), "endpoints": list(self.config.bind),
                "curve": self.config.curve,  # tcp endpoints authenticate clients
                "uptime_s": round(time.time() - self.started, 3),
                "threads": self.pool.num_threads, "clients": len(self.clients),
                "sessions": len(self.sessions),
                "envs": sum(s.num_envs for s in self.sessions.values()),
                "shm_bytes": self.shm_bytes, "state_bytes": self.state_bytes,
                "unread_reply_bytes": self.replies.total,
                "dropped_clients": self.dropped_clients,
                "env_steps": self.env_steps, "draining": self.draining,
                "lease_timeout": self.config.lease_timeout, "limits": self._limits(),
                "plugins": self.plugins, "session_table": self._session_table()}

    def _session_table(self) -> list[dict[str, Any]]:
        """One row per open session, for `envd status` (env steps per second
        are averages over the session's life)."""
        now = time.monotonic()
        return [{"session": s.id[:8], "env_id": s.spec.id, "num_envs": s.num_envs,
                 "batch_size": s.batch_size, "env_steps": s.env_steps,
                 "age_s": round(now - s.created, 3)} for s in self.sessions.values()]
