"""The control handlers: hello, heartbeat, list_envs, status, make, close, bye.

None of them steps an env.  ``make`` is the one that takes time: the env
kind's daemon builder (envd.make_options.KINDS, server/make_builders.py)
checks the message and reserves what the session will hold
(server/reservation.py), the session is built on the Service's executor,
and the executor's callback either opens it (the reply names it) or
discards it (the client left or the daemon drains meanwhile, or its segment
was truncated).  The rest answer at once.
"""
from __future__ import annotations

import logging
import os
import socket
from typing import TYPE_CHECKING, Any

from envd import __version__, protocol
from envd import make_options as options
from envd.errors import (
    DaemonError,
    SessionExpiredError,
    SharedMemoryError,
    ShuttingDownError,
    UnknownSessionError,
)
from envd.make_options import DAEMON, MAX_NUM_ENVS
from envd.native.registry import get_spec, list_envs
from envd.server.capabilities import hello_capabilities
from envd.server.fair_ops import Done
from envd.server.hosted import HostedServerSession
from envd.server.make_builders import DaemonBuilder
from envd.server.sessions import ClientRecord, Session

if TYPE_CHECKING:
    from envd.server.reservation import Reservation
    from envd.server.service import Service
    from envd.server.stepping import Handler

log = logging.getLogger("envd.server")


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
                         "max_episode_steps": hosted.max_episode_steps,
                         "num_agents": hosted.num_agents,  # (a "pz:" env's agents: rows)
                         "params": [], "info_fields": [], "origin": hosted.origin})
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
        """Build the session of the env kind's daemon builder
        (envd.make_options.KINDS, server/make_builders.py) on the executor;
        _made replies."""
        service = self.service
        service.close_revoked_sessions()  # a truncated session must not count against the limits
        self._take_lists(header, blobs)
        kind = options.env_kind(header["env_id"])
        kind.refuse_place(DAEMON, header["env_id"])
        # what this kind of env does not take, refused once (envd.make_options)
        options.refuse_unsupported(kind.name, DAEMON, options.wire_options(header),
                                   header["env_id"])
        builder: DaemonBuilder = options.load(kind.daemon_builder)
        reservation, build = builder(service, client, header, kind)

        def done(future: Done) -> None:
            self._made(client, header["id"], reservation, future)

        try:
            # from here done releases the reservation
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
