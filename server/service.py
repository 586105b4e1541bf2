"""The daemon's request handling: dispatch, clients, sessions' books, leases.

The Service knows nothing of sockets: the daemon hands it each request's
frames with the sender's identity and gives it a ``send(identity, reply)``
callable.  Everything here runs on the event loop thread and never blocks on
env work.  The handlers live apart: server/control.py (hello, heartbeat,
list_envs, status, make, close, bye) and server/stepping.py (reset, step,
send, recv, fast, render, and the requests waiting on the pool).  A session's
life is one state with every transition in server/lifecycle.py; a make's
limit accounting is a reservation (server/reservation.py).  The Service keeps
what they share: dispatch, the clients and their sessions, the resource
books, leases, truncated segments, draining and status.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import os
import socket
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from envd import __version__, protocol
from envd.errors import (
    ConnectionLostError,
    DaemonError,
    EnvdError,
    EnvStateError,
    LimitExceededError,
    SessionExpiredError,
    SharedMemoryError,
    ShuttingDownError,
    UnknownSessionError,
)
from envd.native import segment_guard
from envd.native.native_vec import NativePool
from envd.server.config import Config
from envd.server.control import ControlHandlers
from envd.server.fair_ops import Done, FairOps
from envd.server.hosted import HostedCatalog, HostedServerSession, WorkerReaper
from envd.server.replies import ReplyBooks, is_small
from envd.server.reservation import ResourceBooks
from envd.server.sessions import ClientRecord, Session
from envd.server.stepping import SteppingHandlers

log = logging.getLogger("envd.server")

#: The daemon's transport: send(identity, reply) puts the reply (its packed
#: header under "_header", data frames under "_blobs") on the peer's queue;
#: False when that queue is full (the peer reads no replies).
Send = Callable[[bytes, dict[str, Any]], bool]
#: How many expired session / client ids the daemon remembers, to answer
#: "expired" rather than "unknown" (bounded: a long-lived daemon must not
#: grow; each memo about 1 MiB, tests/server/test_memos.py, SECURITY.md).
_EXPIRED_MEMORY = 8192
#: Requests a draining daemon still serves.
_DRAIN_ALLOWED = {"hello", "close", "bye", "heartbeat", "status"}
#: Requests --max-requests-per-second never refuses: a throttled client can
#: always keep its lease and leave.
_NEVER_THROTTLED = frozenset({"heartbeat", "close", "bye"})


def _without_blobs(reply: dict[str, Any]) -> dict[str, Any]:
    """A reply's header fields (its data frames go after the header)."""
    return {k: v for k, v in reply.items() if k != "_blobs"}


class Service:
    """Clients, their sessions and the dispatch of every message type."""

    def __init__(self, config: Config, pool: NativePool, executor: Executor, send: Send,
                 segment_prefix: str, plugins: list[dict[str, Any]] | None = None,
                 step_latency: Callable[[float], None] | None = None,
                 hosted: HostedCatalog | None = None):
        self.config = config
        self.hosted = hosted or HostedCatalog()  # the Python envs the operator allowed
        self.plugins = list(plugins or ())  # what load_plugins reported, for status
        self.segment_prefix = segment_prefix
        self.pool = pool
        self.executor = executor
        self._transmit = send
        self.replies = ReplyBooks(config.reply_bytes_per_client, config.reply_bytes_total)
        self.books = ResourceBooks(config)
        self.dropped_clients = 0  # clients dropped for leaving their replies unread
        self.refused_headers = 0  # header frames refused before decoding (size, depth, count)
        self.clients: dict[bytes, ClientRecord] = {}
        self.sessions: dict[str, Session] = {}  # open sessions (OPEN or BUSY) by id
        self._alive: set[Session] = set()  # every session not freed yet, making ones included
        self.draining = False
        self.started = time.time()
        self.env_steps = 0
        # For the metrics (server/metrics.py reads them at scrape time):
        self.env_steps_by_env: collections.Counter[str] = collections.Counter()
        self.closed_session_jobs: list[float] = [0, 0]  # inline, pooled step jobs of closed sessions
        self.lease_expiries = 0            # clients whose lease expired
        self.lease_expired_sessions = 0    # sessions freed by those expiries
        # seconds from a sync step's submit to its reply (a no-op without metrics)
        self.step_latency = step_latency or (lambda seconds: None)
        self._running_ops = 0        # makes, resets and renders queued or on the executor
        # The operation threads shared fairly between clients (fair_ops.py).
        self.ops = FairOps(self._start_op, config.max_ops_per_client, config.max_queued_ops)
        self._rate = config.max_requests_per_second  # 0: unlimited
        self._burst = config.request_burst
        self._expired_sessions: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._expired_clients: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        # Sessions closed because a client truncated their segment (answered
        # with that reason, not "unknown"), and the guard's revocation count
        # when the sessions were last looked at.
        self._revoked_sessions: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._revocations_seen = segment_guard.revocations()
        self.control = ControlHandlers(self)
        self.stepping = SteppingHandlers(self)
        self._handlers = {**self.control.handlers(), **self.stepping.handlers()}

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
            try:  # bounded before anything is decoded (protocol.unpack)
                header = protocol.unpack(frames[0], self.config.header_bytes)
            except protocol.BadRequest:
                self.refused_headers += 1
                raise
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

    def cancel_ops(self, client: ClientRecord, why: str) -> None:
        """Fail the client's operations still waiting for a thread (it left:
        see FairOps.cancel)."""
        self.ops.cancel(client.identity, ConnectionLostError(
            f"this connection ended ({why}) before the operation started; it was not run"))

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
        self.cancel_ops(client, "dropped: replies unread")
        for session in list(client.sessions.values()):
            self._remember(self._expired_sessions, session.id)
            self.drop(session, "dropped (replies unread)")
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
        client: ClientRecord | None
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

    def session_for(self, client: ClientRecord, header: dict[str, Any],
                    beside: str | None = None) -> Session:
        """The open session a request names, or the error that says why not
        (truncated, expired, unknown, busy).  beside: an operation this
        request may run beside (a send beside a parked "recv")."""
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
        if session.life.busy and session.life.operation != beside:
            raise EnvStateError(f"session {session_id} is busy: a session takes one request at "
                                f"a time and a {session.life.operation} is still running")
        return session

    def ended_by_daemon(self, session_id: str) -> bool:
        """The daemon closed this session (lease expired, client dropped,
        segment truncated): closing it again is no error."""
        return session_id in self._expired_sessions or session_id in self._revoked_sessions

    # ---- what the handlers share ------------------------------------------------------------
    def check_op_room(self, client: ClientRecord) -> None:
        """LimitExceededError when the client's queue of operations is full
        (--max-queued-ops); call it before the request reserves or changes
        anything, then submit it."""
        try:
            self.ops.check_room(client.identity)
        except LimitExceededError:
            client.ops_refused += 1
            raise

    def submit(self, owner: bytes, fn: Callable[[], Any], done: Callable[[Done], None]) -> None:
        """Run fn on an operation thread in owner's turn (server/fair_ops.py);
        done(future) runs on the event loop thread (then a draining daemon
        checks whether it is done)."""
        self._running_ops += 1

        def finished(future: Done) -> None:
            self._running_ops -= 1
            try:
                done(future)
            finally:
                self._check_drained()

        self.ops.submit(owner, fn, finished)

    def _start_op(self, fn: Callable[[], Any], finished: Callable[[Done], None]) -> None:
        asyncio.get_running_loop().run_in_executor(self.executor, fn).add_done_callback(finished)

    @staticmethod
    def result_reply(request_id: int, future: Done) -> dict:
        """The reply to an operation that ran on the executor: ok, or its error."""
        exc = future.exception()
        if exc is None:
            return protocol.ok_reply(request_id)
        if isinstance(exc, EnvdError):
            return protocol.error_reply(request_id, exc)
        log.error("internal error in an operation", exc_info=exc)
        return protocol.error_reply(request_id, DaemonError(
            "internal error in the daemon; its log has the details"))

    def count_steps(self, session: Session, count: int) -> None:
        self.env_steps += count
        self.env_steps_by_env[session.spec.id] += count

    def on_pool_event(self) -> None:
        """The pool's eventfd fired: answer what finished (server/stepping.py)."""
        try:
            os.read(self.pool.eventfd(), 8)
        except BlockingIOError:
            pass
        self.stepping.on_pool_event()
        self._check_drained()

    def collect_doorbell_steps(self) -> None:
        """Count the env steps the sessions served since last time (for status
        and metrics): the doorbell's and async envs found finished are counted
        here, at most a lease tick late; socket steps and recvs as they end.
        A fast-path session that served steps renews its client's lease: the
        lease counts from the last request on any path (the doorbell's seen
        here, at most a lease tick late, never early)."""
        for session in self.sessions.values():
            before = session.steps + session.env_steps
            self.stepping.count_steps(session, collect=True)
            if session.fast_path and session.steps + session.env_steps != before:
                owner = self.clients.get(session.owner)
                if owner is not None:
                    owner.touch()

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
        if session.fast_path:  # its client waits on the doorbell in its own
            session.mark_doorbell_closed()  # mapping of the file (removed by drop)
        self.drop(session, "closed (segment truncated)")

    def _revoked_error(self, session_id: str) -> SharedMemoryError:
        return SharedMemoryError(
            f"session {session_id} was closed: a process truncated (ftruncate) its "
            "shared-memory segment while the daemon used it, so its results are lost. Nothing "
            "may resize a session's segment under /dev/shm; make a new env")

    def revoked_reply(self, session: Session, request_id: int) -> dict:
        """Close a session whose segment was truncated; the error reply saying so."""
        self._revoke(session)
        return protocol.error_reply(request_id, self._revoked_error(session.id))

    # ---- sessions and leases ----------------------------------------------------------
    def made(self, session: Session) -> None:
        """A make built this session (called on the executor thread: set.add is
        atomic): shutdown frees it even if its make is never answered."""
        self._alive.add(session)

    def drop(self, session: Session, why: str = "closed") -> None:
        """Take the session out of the books and close it: it is freed now, or
        when its running operation ends and its batches settle."""
        log.info("session %s", why, extra={
            "event": "session_close" if why == "closed" else "session_expire",
            "client": session.owner.hex()[:8], "session": session.id[:8],
            "env_id": session.spec.id, "env_steps": session.env_steps})
        self.sessions.pop(session.id, None)
        owner = self.clients.get(session.owner)
        if owner is not None:
            owner.sessions.pop(session.id, None)
        session.life.close()
        self.stepping.settle_later(session)  # (batches in flight: freed once they end)
        if not session.life.freed and hasattr(session, "reclaim_later"):
            session.reclaim_later()  # a hosted env may hang: its workers go after a grace

    def on_session_freed(self, session: Session, orderly: bool) -> None:
        """The session's lifecycle frees it (exactly once): its fast path is
        stopped and its counts and bytes given back, then the session destroys
        its envs.  The fast path is stopped here, not at drop: an operation on
        the executor (reset, render) holds the fast path's lock until it ends,
        and stopping it under that operation would destroy the lock it holds."""
        self._alive.discard(session)
        self.stepping.forget(session)  # (at shutdown a step or recv may still wait)
        if session.fast_path:  # first: its thread steps the vec
            self.stepping.stop_doorbell(session, freeing=True)
        native = session.native_if_alive
        if orderly and native is not None:  # no step job starts after this
            self.stepping.count_steps(session)
            stats = native.stats()
            self.closed_session_jobs[0] += stats["inline_jobs"]
            self.closed_session_jobs[1] += stats["pooled_jobs"]
        self.books.give_back(session)

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
            self.cancel_ops(client, "lease expired")
            for session in list(client.sessions.values()):
                self._remember(self._expired_sessions, session.id)
                self.drop(session, "expired (lease)")
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

    # ---- draining and shutdown ----------------------------------------------------------
    def start_draining(self) -> None:
        """SIGTERM: refuse new work, let what runs finish, and after
        --drain-grace kill what still runs in hosted envs (_end_grace)."""
        self.draining = True
        for session in self.sessions.values():
            if session.fast_path:
                session.native.drain()
            # A hosted env's step or batch may hang (the drain waits for
            # them): its workers are killed after a grace (the close's).
            if isinstance(session, HostedServerSession) and session.busy_or_in_flight():
                session.reclaim_later("the daemon drains")
        asyncio.get_running_loop().call_later(self.config.drain_grace, self._end_grace)
        self._check_drained()

    def _end_grace(self) -> None:
        """The drain's grace passed and work still runs: a hosted make, reset
        or step that has not ended is killed, whatever --hosted-timeout says
        (the template dies, and with it every worker: PR_SET_PDEATHSIG; a
        make waiting for its workers fails at once, and later hosted makes
        are refused), so that a SIGTERM ends within the grace plus the
        shutdown's own time (server/daemon.py, SHUTDOWN_SECONDS)."""
        if self.idle or not self.hosted.specs:
            return
        log.warning("the drain's grace of %g s (--drain-grace) passed with %d operation(s) "
                    "still running: killing the hosted envs' workers and template",
                    self.config.drain_grace, self._running_ops,
                    extra={"event": "drain_kill"})
        self.hosted.kill()
        for session in list(self._alive):
            if hasattr(session, "kill_workers"):
                session.kill_workers()

    def _check_drained(self) -> None:
        if self.draining and self.idle and self.on_drained is not None:
            self.on_drained()

    on_drained: Callable[[], None] | None = None
    #: Set by the daemon: raises LimitExceededError when the file descriptors
    #: left cannot take one more session (arguments: makes in flight, the
    #: workers of the hosted ones, the new make's workers).
    fd_check: Callable[[int, int, int], None] | None = None
    #: (add, remove) of the event loop's readers, set by the daemon: a hosted
    #: session's worker pidfds are watched, so that a worker's death answers
    #: the step or recv that waits for it (no eventfd comes from a dead worker).
    fd_watch: tuple[Callable[..., None], Callable[[int], object]] | None = None
    #: Set by the daemon with fd_watch: waits on the event loop for the
    #: workers of freed hosted sessions (server/hosted.py).
    reaper: WorkerReaper | None = None

    @property
    def idle(self) -> bool:
        """No step, reset, render, make or async batch is running."""
        return self._running_ops == 0 and self.stepping.idle

    def free_all(self) -> None:
        """Free every session at shutdown, once the executor has stopped:
        freeing a session waits for its step or batches still in flight."""
        for session in list(self._alive):
            self.sessions.pop(session.id, None)
            session.life.shut_down()
        self.stepping.forget_all()

    # ---- status -----------------------------------------------------------------------------
    def limits(self) -> dict[str, int]:
        return {"max_sessions": self.config.max_sessions,
                "max_envs_per_client": self.config.max_envs_per_client,
                "max_message_bytes": self.config.max_message_bytes,
                "max_header_bytes": self.config.header_bytes,
                "max_sessions_per_client": self.config.max_sessions_per_client,
                "max_shm_bytes": self.config.max_shm_bytes,
                "max_state_bytes": self.config.max_state_bytes,
                "max_requests_per_second": self.config.max_requests_per_second,
                "request_burst": self.config.request_burst,
                "max_reply_bytes_per_client": self.config.reply_bytes_per_client,
                "max_reply_bytes": self.config.reply_bytes_total,
                "max_workers": self.config.max_workers}

    @property
    def sessions_stepping(self) -> int:
        """Sessions with a sync step or async batches on the pool now."""
        return self.stepping.sessions_stepping

    @property
    def shm_bytes(self) -> int:
        """Bytes of shared memory the sessions hold, makes in flight included."""
        return self.books.shm_bytes

    @property
    def state_bytes(self) -> int:
        """Heap bytes the sessions' env state holds at most (state_plan),
        makes in flight included."""
        return self.books.state_bytes

    def status(self) -> dict[str, Any]:
        """What `envd status` prints: version, load and limits."""
        self.collect_doorbell_steps()  # the fast path's steps, up to now
        return {"server": f"envd {__version__}", "pid": os.getpid(),
                "hostname": socket.gethostname(), "endpoints": list(self.config.bind),
                "curve": self.config.curve,  # tcp endpoints authenticate clients
                "uptime_s": round(time.time() - self.started, 3),
                "threads": self.pool.num_threads, "clients": len(self.clients),
                "sessions": len(self.sessions),
                "envs": sum(s.num_envs for s in self.sessions.values()),
                # (a multi-agent env's agents are rows: envs x agents; a hosted
                # PettingZoo env's too, as its client views them)
                "rows": sum(s.num_envs * s.agents_per_env for s in self.sessions.values()),
                # worker processes of hosted Python envs (--max-workers)
                "workers": self.books.workers,
                "python_envs": self.hosted.ids(),
                "shm_bytes": self.shm_bytes, "state_bytes": self.state_bytes,
                "unread_reply_bytes": self.replies.total,
                "dropped_clients": self.dropped_clients,
                "refused_headers": self.refused_headers,
                # ids of gone connections and sessions remembered (bounded memos)
                "remembered_ids": (self.replies.remembered_drops + len(self._expired_sessions)
                                   + len(self._expired_clients) + len(self._revoked_sessions)),
                "env_steps": self.env_steps, "draining": self.draining,
                "lease_timeout": self.config.lease_timeout, "limits": self.limits(),
                "operations": self._operations(),
                "plugins": self.plugins, "session_table": self._session_table()}

    def _operations(self) -> dict[str, Any]:
        """Makes, resets and renders running, waiting and refused (fair_ops.py),
        over all clients and per client (those with any)."""
        owners = {*self.ops.owners(), *(i for i, c in self.clients.items() if c.ops_refused)}
        rows = []
        for owner in sorted(owners):
            running, queued = self.ops.waiting(owner)
            client = self.clients.get(owner)
            rows.append({"client": owner.hex()[:8], "running": running, "queued": queued,
                         "refused": client.ops_refused if client is not None else 0})
        return {"running": self.ops.running, "queued": self.ops.queued,
                "refused": self.ops.refused, "max_ops_per_client": self.ops.per_client,
                "max_queued_ops": self.ops.max_queued, "clients": rows}

    def _session_table(self) -> list[dict[str, Any]]:
        """One row per open session, for `envd status` (env steps per second
        are averages over the session's life)."""
        now = time.monotonic()
        return [{"session": s.id[:8], "env_id": s.spec.id, "num_envs": s.num_envs,
                 "num_agents": s.agents_per_env,  # (rows per env, as the trainer sees them)
                 "batch_size": s.batch_size, "max_threads": getattr(s, "max_threads", None),
                 "env_steps": s.env_steps, "workers": getattr(s, "num_workers", 0),
                 "age_s": round(now - s.created, 3)} for s in self.sessions.values()]
