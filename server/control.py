"""The control handlers: hello, heartbeat, list_envs, status, make, close, bye.

None of them steps an env.  ``make`` is the one that takes time: it reserves
what the session will hold (server/reservation.py), builds the session on the
Service's executor, and from the executor's callback either opens it (the
reply names it) or discards it (the client left or the daemon drains
meanwhile, or its segment was truncated).  The rest answer at once.
"""
from __future__ import annotations

import logging
import os
import secrets
import socket
from typing import TYPE_CHECKING, Any

from gymnasium.vector import AutoresetMode

from envd import __version__, protocol
from envd import make_options as options
from envd.errors import (
    DaemonError,
    InvalidArgumentError,
    LimitExceededError,
    SessionExpiredError,
    SharedMemoryError,
    ShuttingDownError,
    UnknownEnvError,
    UnknownSessionError,
)
from envd.int_args import seed_list
from envd.make_options import DAEMON, MAX_NUM_ENVS, NATIVE
from envd.native.registry import get_spec, list_envs
from envd.native.vector_env import check_episode
from envd.server.capabilities import hello_capabilities
from envd.server.fair_ops import Done
from envd.server.hosted import HostedServerSession
from envd.server.sessions import ClientRecord, Session

if TYPE_CHECKING:
    from envd.server.reservation import Reservation
    from envd.server.service import Service
    from envd.server.stepping import Handler

log = logging.getLogger("envd.server")

#: Longest env id echoed back in an error message.
_ECHO_LIMIT = 100
#: A make request's fields besides the env kwargs: a kwarg close to one of
#: them (sed=0) is suggested as that argument in the error.
_MAKE_ARGUMENTS = tuple(f for f in protocol.MESSAGE_FIELDS["make"] if f != "env_kwargs")


class ControlHandlers:
    """hello, heartbeat, list_envs, status, make, close and bye for one Service."""

    def __init__(self, service: Service):
        self.service = service
        self.config = service.config

    def handlers(self) -> dict[str, Handler]:
        return {"hello": self.hello, "heartbeat": self.heartbeat, "list_envs": self.list_envs,
                "status": self.status, "make": self.make, "close": self.close, "bye": self.bye}

    def hello(self, client: ClientRecord, header: dict[str, Any], blobs: list[bytes]) -> dict:
        client.name = header.get("client_name", "")[:200]
        return protocol.ok_reply(
            header["id"], version=protocol.PROTOCOL_VERSION, server=f"envd {__version__}",
            pid=os.getpid(), hostname=socket.gethostname(),
            lease_timeout=self.config.lease_timeout,
            heartbeat_interval=self.config.heartbeat_interval,
            # limits also stay at the top level for clients older than capabilities
            limits=self.service.limits(),
            capabilities=hello_capabilities(self.config, self.service.limits()))

    def heartbeat(self, client: ClientRecord, header: dict[str, Any], blobs: list[bytes]) -> dict:
        return protocol.ok_reply(header["id"])

    def list_envs(self, client: ClientRecord, header: dict[str, Any], blobs: list[bytes]) -> dict:
        envs = []
        for env_id in list_envs():
            spec = get_spec(env_id)
            envs.append({"id": env_id,
                         "observation_space": protocol.space_to_wire(spec.observation_space),
                         "action_space": protocol.space_to_wire(spec.action_space),
                         "max_episode_steps": spec.max_episode_steps,
                         "num_agents": spec.num_agents,  # (rows per env)
                         "params": [{"name": p.name, "type": p.type, "default": p.default,
                                     "min": p.min_value, "max": p.max_value, "doc": p.doc}
                                    for p in spec.params],
                         "info_fields": [{"name": f.name, "dtype": f.dtype.name,
                                          "shape": list(f.shape), "doc": f.doc}
                                         for f in spec.info_fields],
                         # ABI 5: spaces at the defaults when they depend on the params
                         "describes": spec.describes, "resets_itself": spec.resets_itself,
                         "episode_fields": list(spec.episode_fields),
                         "origin": spec.origin})
        for hosted in map(self.service.hosted.get, self.service.hosted.ids()):
            envs.append({"id": hosted.id,
                         "observation_space": protocol.space_to_wire(hosted.observation_space),
                         "action_space": protocol.space_to_wire(hosted.action_space),
                         "max_episode_steps": hosted.max_episode_steps, "params": [],
                         "info_fields": [], "origin": hosted.origin})
        return protocol.ok_reply(header["id"], envs=envs)

    def status(self, client: ClientRecord, header: dict[str, Any], blobs: list[bytes]) -> dict:
        return protocol.ok_reply(header["id"], **self.service.status())

    # ---- make ---------------------------------------------------------------------------------
    @staticmethod
    def _take_lists(header: dict[str, Any], blobs: list[bytes]) -> None:
        """Put make's per-env lists that came as data frames (the seeds, a
        kwarg's values: protocol.list_to_blob) in place; every frame must be
        named once."""
        used: set[int] = set()
        header["seed"] = protocol.list_from_blob(header.get("seed"), blobs, used, MAX_NUM_ENVS)
        kwargs = header.get("env_kwargs")
        if kwargs:
            header["env_kwargs"] = {name: protocol.list_from_blob(value, blobs, used,
                                                                  MAX_NUM_ENVS)
                                    for name, value in kwargs.items()}
        unnamed = len(blobs) - len(used)
        if unnamed:
            raise protocol.BadRequest(f"make: got {len(blobs)} data frames, {unnamed} of which "
                                      "no per-env list names")

    def make(self, client: ClientRecord, header: dict[str, Any], blobs: list[bytes]) -> None:
        service = self.service
        service.close_revoked_sessions()  # a truncated session must not count against the limits
        self._take_lists(header, blobs)
        env_id = header["env_id"]
        kind = options.kind_of(env_id)
        # what this kind of env does not take, refused once (envd.make_options)
        options.refuse_unsupported(kind, DAEMON, {
            name: header.get(name) for name in ("max_episode_steps", "max_threads",
                                                "num_workers", "info_bytes")}, env_id)
        if kind != NATIVE:
            return self._make_hosted(client, header)
        if len(env_id) > _ECHO_LIMIT:
            raise UnknownEnvError(
                f"unknown env id of {len(env_id)} characters; known ids: "
                f"{', '.join(list_envs())}")
        spec = get_spec(env_id)
        num_envs = options.check_num_envs(header["num_envs"])
        env_kwargs = header.get("env_kwargs", {})
        params = None
        if spec.describes:
            # ABI 5: the spaces, which the reservation sizes, come from the
            # params.  Scalars: one row describes every env (the envs' rows
            # are built on the executor, as for any env); a list of num_envs
            # values came in this message, and each env is described.
            per_env = any(isinstance(value, (list, tuple)) for value in env_kwargs.values())
            rows = num_envs if per_env else 1
            values = spec.param_values(env_kwargs, _MAKE_ARGUMENTS, rows)
            spec = spec.described(values, rows)
            params = values if per_env else None
        options.check_rows(spec.id, num_envs, spec.num_agents)
        batch_size = options.check_batch_size(header.get("batch_size"), num_envs)
        mode, max_steps = check_episode(spec, header.get("autoreset_mode"),
                                        header.get("max_episode_steps"))
        render_mode = spec.check_render_mode(header.get("render_mode"))
        max_threads = options.check_max_threads(header.get("max_threads"),
                                                self.service.pool.num_threads)
        seed = header.get("seed")
        options.check_seed(seed, num_envs)
        service.check_op_room(client)  # before anything is reserved
        reservation = service.books.reserve(client, spec, num_envs, mode, len(service.sessions),
                                            service.fd_check)

        def build() -> Session:  # on the executor: seeds and envs of big makes take time
            values = (params if params is not None
                      else spec.param_values(env_kwargs, _MAKE_ARGUMENTS, num_envs))
            seeds = seed_list(secrets.randbelow(2**63) if seed is None else seed, num_envs)
            try:
                session = Session(client.identity, spec, num_envs, mode, max_steps, values,
                                  seeds, service.pool, service.segment_prefix,
                                  on_free=service.on_session_freed,
                                  max_threads=max_threads)
            except (OSError, MemoryError) as exc:  # /dev/shm or the heap is full
                raise LimitExceededError(
                    f"cannot allocate {num_envs} {spec.id} envs: {exc}; the host's shared "
                    "memory (/dev/shm; in a container see --shm-size) or memory is exhausted"
                ) from None
            session.batch_size = batch_size or num_envs
            session.render_mode = render_mode
            service.made(session)  # (from this thread: shutdown frees it if need be)
            return session

        def done(future: Done) -> None:
            self._made(client, header["id"], reservation, future)

        try:
            # from here done releases the reservation
            service.submit(client.identity, build, done)
        except BaseException:
            reservation.release()
            raise
        return None

    def _make_hosted(self, client: ClientRecord, header: dict[str, Any]) -> None:
        """make of a Python env the operator allowed (server/hosted.py):
        num_workers worker processes forked from the daemon's template."""
        service = self.service
        spec = service.hosted.get(header["env_id"])
        kind = options.kind_of(spec.id)
        num_envs = options.check_num_envs(header["num_envs"])
        batch_size = options.check_batch_size(header.get("batch_size"), num_envs)
        mode = (options.check_autoreset_mode(kind, header.get("autoreset_mode"))
                or AutoresetMode.NEXT_STEP)
        max_steps = options.check_max_episode_steps(kind, header.get("max_episode_steps"))
        render_mode = options.check_render_mode(header.get("render_mode"), spec.id)
        if header.get("env_kwargs"):
            raise InvalidArgumentError(
                f"{spec.id}: a daemon-hosted Python env takes no env kwargs (the operator's "
                "--python-env id fixes the env; register a variant with gymnasium.register "
                "in an --import module)")
        num_workers = options.check_num_workers(header.get("num_workers"), num_envs, DAEMON)
        if num_workers is None:
            num_workers = spec.default_workers(num_envs)
        info_bytes = options.check_info_bytes(kind, header.get("info_bytes"))
        seed = header.get("seed")
        options.check_seed(seed, num_envs)  # refused before anything is reserved
        service.check_op_room(client)
        reservation = service.books.reserve(client, spec, num_envs, mode, len(service.sessions),
                                            service.fd_check, num_workers=num_workers,
                                            info_bytes=info_bytes)

        def build() -> Session:  # on the executor: forking and making the envs takes time
            seeds = seed_list(secrets.randbelow(2**63) if seed is None else seed, num_envs)
            try:
                session = HostedServerSession(
                    client.identity, spec, num_envs, mode, max_steps, seeds, num_workers,
                    service.segment_prefix, service.hosted.template, service.pool.eventfd(),
                    on_free=service.on_session_freed, info_bytes=info_bytes,
                    timeout=service.config.hosted_timeout, render_mode=render_mode)
            except (OSError, MemoryError) as exc:
                raise LimitExceededError(
                    f"cannot make {num_envs} {spec.id} envs in {num_workers} workers: {exc}"
                ) from None
            session.batch_size = batch_size or num_envs
            service.made(session)
            return session

        def done(future: Done) -> None:
            self._made(client, header["id"], reservation, future)

        try:
            service.submit(client.identity, build, done)
        except BaseException:
            reservation.release()
            raise
        return None

    def _made(self, client: ClientRecord, request_id: int, reservation: Reservation,
              future: Done) -> None:
        """A make's build ended on the executor: reply exactly once, with its
        session or its error; the reservation is released exactly once.  A
        bug while opening the session (an internal error) still answers, and
        frees the session: the client never learned its id."""
        service = self.service
        with reservation:
            reply = service.result_reply(request_id, future)
            if reply["ok"]:
                session: Session = future.result()
                try:
                    reply = self._open(client, session, reservation, reply)
                except Exception:  # a bug: answer, leave nothing behind
                    log.exception("internal error while opening a made session")
                    reply = protocol.error_reply(request_id, DaemonError(
                        "internal error in the daemon; its log has the details"))
                    if service.sessions.get(session.id) is session:
                        service.drop(session)
                    elif not session.life.freed:
                        session.life.shut_down()
        service.send(client.identity, reply)

    def _open(self, client: ClientRecord, session: Session, reservation: Reservation,
              reply: dict) -> dict:
        """The make's session was built: open it (its id goes in the reply), or
        discard it when it may not be used."""
        service = self.service
        reservation.claim(session)
        request_id = reply["id"]
        if isinstance(session, HostedServerSession) and service.reaper is not None:
            session.reap = service.reaper.reap  # (its workers' exit is awaited on the loop)
        if service.draining or service.clients.get(client.identity) is not client:
            session.life.discard()  # the client expired or the daemon drains meanwhile
            return protocol.error_reply(request_id, ShuttingDownError(
                "the daemon is shutting down") if service.draining else SessionExpiredError(
                "the client left (bye) or its lease expired while its env was being made"))
        if session.revoked:
            session.life.discard()  # truncated before its client even knew its name
            return protocol.error_reply(request_id, SharedMemoryError(
                f"making {session.num_envs} {session.spec.id} envs failed: a process truncated "
                f"the new session's shared-memory segment {session.segment.path} while the "
                "daemon set it up; nothing may resize a session's segment"))
        session.life.open()
        if isinstance(session, HostedServerSession) and service.fd_watch is not None:
            session.watch_workers(*service.fd_watch, service.on_pool_event)
        service.sessions[session.id] = client.sessions[session.id] = session
        reply.update(session.describe())
        log.info("session opened: %d x %s", session.num_envs, session.spec.id, extra={
            "event": "session_open", "client": client.identity.hex()[:8],
            "request_id": request_id, "session": session.id[:8],
            "env_id": session.spec.id, "num_envs": session.num_envs})
        return reply

    # ---- close and bye ------------------------------------------------------------------------
    def close(self, client: ClientRecord, header: dict[str, Any], blobs: list[bytes]) -> dict:
        session_id = header["session"]
        session = client.sessions.get(session_id)
        if session is None and not self.service.ended_by_daemon(session_id):  # closed: fine
            raise UnknownSessionError(f"no session {session_id!r} on this connection")
        if session is not None:
            self.service.drop(session)
        return protocol.ok_reply(header["id"])

    def bye(self, client: ClientRecord, header: dict[str, Any], blobs: list[bytes]) -> dict:
        self.service.cancel_ops(client, "bye")
        for session in list(client.sessions.values()):
            self.service.drop(session)
        del self.service.clients[client.identity]
        return protocol.ok_reply(header["id"])
