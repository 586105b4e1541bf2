"""The daemon: startup -> serve -> shutdown around its ROUTER sockets and one pool.

One ROUTER socket serves every endpoint, except with CURVE keys
(--curve-secret-key): then the tcp endpoints get a second ROUTER socket, a
CURVE server whose clients a ZAP handler (pyzmq's ThreadAuthenticator) checks
against --curve-allowed-clients, and the ipc endpoints stay on a plain one
(their socket folder is mode 0700; a health check runs `envd status` there
without keys).  Service sees one stream of (routing id, frames) either way:
the daemon remembers which socket each routing id spoke on and sends its
replies there.

Event loop (asyncio on uvloop; plain asyncio when uvloop is missing) with one
reader per socket and one for the pool, and no busy polling:
  - each ROUTER socket's ZMQ_FD.  It is edge-triggered: it signals when the
    socket's state may have changed, so the reader drains every queued
    message, and after each send the daemon checks that socket's ZMQ_EVENTS
    again (a send can consume the edge of a message that arrived meanwhile);
  - the pool's eventfd, readable when a submitted step finished;
and beside the loop, the connection thread (envd-conn) reads each ROUTER
socket's monitor (accepted and closed connections with their fds) the moment
an event comes: see server/connections.py for the connection cap, the hello
timeout and the binding of routing ids to connections.

Signals: the first SIGTERM or SIGINT drains (new work is refused, running
steps/resets/makes finish and get their replies, every segment is freed,
exit status 0); a second one unlinks the segments and exits at once with
status 1.  Once drained, the daemon still reads what is queued on its sockets
and answers each request (shutting_down for new work) before it closes them:
every request that reaches it gets exactly one reply.  At startup, the
open-file limit is raised and segments of dead daemons are removed.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import zmq

from envd import __version__, protocol
from envd.errors import LimitExceededError
from envd.keys import KeyFileError, writable_by_others
from envd.native import segment_guard
from envd.native.native_vec import NativePool, set_doorbell_spinners
from envd.native.ocean_ids import load_for_daemon
from envd.protocol import default_endpoint
from envd.server import logs
from envd.server.config import Config
from envd.server.connections import (
    FDS_PER_HOSTED_MAKE,
    FDS_PER_MAKE,
    Connections,
    default_max_connections,
    fd_reserve,
    make_fds,
    open_fds,
    raise_fd_limit,
)
from envd.server.fair_ops import OPERATION_THREADS
from envd.server.hosted import HostedCatalog, WorkerReaper
from envd.server.peer_auth import CURVE_DOMAIN, IPC_DOMAIN, PeerAuthenticator
from envd.server.plugins import load_plugins
from envd.server.service import Service
from envd.server.stale_segments import Instance, remove_stale_segments

if TYPE_CHECKING:  # (prometheus-client: imported only with --metrics-port)
    from envd.server.metrics import Metrics

log = logging.getLogger("envd.server")

#: Messages handled per reader callback before other callbacks get a turn.
_DRAIN_BATCH = 64
#: How long shutdown waits to flush the last replies.
_LINGER_MS = 2000
#: After the drain: how long the daemon reads requests still queued on its
#: sockets (at most), and how long a socket must stay quiet to be done.
_QUEUED_READ_S = 2.0
_QUEUED_QUIET_MS = 50
#: The longest a daemon takes to exit once SIGTERM's drain grace
#: (--drain-grace) passed and what still ran in hosted envs was killed: the
#: queued requests read (_QUEUED_READ_S), the workers of closed sessions
#: reaped (CLOSE_GRACE_SECONDS, then SIGKILL), the sockets' linger
#: (_LINGER_MS), and slack for a loaded machine.  Deploy files give a
#: daemon more than --drain-grace plus this to stop (tests/deploy).
SHUTDOWN_SECONDS = 15.0
#: What the connection monitors report (server/connections.py), and how
#: often the connection thread looks whether it should stop.
_MONITOR_EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED
_MONITOR_POLL_MS = 100


def ipc_path(endpoint: str) -> str | None:
    """The socket file of an ipc endpoint; None for tcp and abstract sockets."""
    path = endpoint[len("ipc://"):]
    if not endpoint.startswith("ipc://") or path.startswith("@"):
        return None
    return path


def prepare_ipc_endpoint(endpoint: str) -> None:
    """Create the socket's folder (mode 0700) and refuse to take over an ipc
    path another live daemon serves (libzmq would silently replace its file)."""
    path = ipc_path(endpoint)
    if path is None:
        return
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        # Only envd's own default folder (in $XDG_RUNTIME_DIR or /tmp, where
        # another user could have made it first) must be private; a folder
        # named by --bind or ENVD_ENDPOINT is the operator's choice (e.g. a
        # Kubernetes emptyDir shared with the trainer, created 0777).
        builtin = default_endpoint({**os.environ, "ENVD_ENDPOINT": ""})
        if folder == os.path.dirname(builtin[len("ipc://"):]):
            check_private_folder(folder)
    if not os.path.lexists(path):
        return
    if not stat.S_ISSOCK(os.lstat(path).st_mode):
        raise RuntimeError(f"{path} exists and is not a socket; pick another endpoint with --bind")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(5.0)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        os.unlink(path)  # left behind by a daemon that died
        return
    except OSError:
        pass  # a live but stuck listener (timeout): not ours to take over
    finally:
        probe.close()
    raise RuntimeError(f"another daemon already serves {endpoint}; stop it or pick another "
                       "endpoint with --bind")


def check_private_folder(folder: str) -> None:
    """The default socket folder must be ours and closed to others (in /tmp,
    another user could create it first and hand clients their own socket)."""
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise RuntimeError(f"{folder} must be a directory owned by uid {os.getuid()} with "
                           f"mode 0700 (it is {oct(info.st_mode & 0o777)}, uid {info.st_uid}); "
                           "remove it, or pick another endpoint with --bind")


class Daemon:
    """One envd daemon process: see the module docstring for its lifecycle."""

    def __init__(self, config: Config):
        self.config = config
        self.exit_status = 0
        self._signals = 0
        self.sockets: list[zmq.Socket] = []
        self.monitors: list[zmq.Socket] = []  # one per socket; the connection thread's
        self._watcher: threading.Thread | None = None
        self._stop_watching = threading.Event()
        self._drain_scheduled: list[bool] = []  # per socket
        # With more than one socket: routing id -> index of the socket it
        # speaks on (None: one socket, nothing to look up).  See _route.
        self._routes: dict[bytes, int] | None = None
        self._misrouted: set[bytes] = set()  # routing ids warned about since the last prune
        self._authenticator: PeerAuthenticator | None = None  # with ipc or CURVE endpoints
        self.metrics: Metrics | None = None  # with --metrics-port

    # ---- startup ---------------------------------------------------------------------
    def startup(self) -> None:
        if self.config.metrics_port:  # first: a taken port refuses to start, with nothing to undo
            try:
                from envd.server.metrics import Metrics
            except ImportError as exc:
                raise RuntimeError(f"--metrics-port needs prometheus-client ({exc}); install "
                                   "it with pip install 'envd-rl[metrics]'") from None
            self.metrics = Metrics(self.config.threads)
            self.metrics.serve(self.config.metrics_port, self.config.metrics_bind)
        try:
            self._startup()
        except BaseException:
            if self.metrics is not None:
                self.metrics.close()
            raise

    def _startup(self) -> None:
        # Before any segment exists: a client truncating its segment must not
        # kill the daemon with SIGBUS (native/src/segment_guard.h).
        segment_guard.install()
        self.fd_limit = raise_fd_limit()
        self._fd_reserve = fd_reserve(self.fd_limit)
        self.connections = Connections(self._max_connections(), self.config.hello_timeout)
        remove_stale_segments(namespace=self.config.shm_namespace or "")
        plugins = load_plugins(self.config.plugins)  # before serving: clients see every env
        if self.config.ocean_envs:
            plugins += load_for_daemon(self.config.ocean_envs, self.config.ocean_cache)
        # The allowed Python envs, described in the template (started from
        # this thread, which it dies with) before anything is bound.
        self.hosted = HostedCatalog(self.config.python_envs, self.config.imports,
                                    self.config.hosted_timeout)
        self.instance = Instance(namespace=self.config.shm_namespace or "")
        self.pool = NativePool(self.config.threads,
                               list(self.config.pin_cpus) if self.config.pin_cpus else None)
        # One doorbell thread may spin at a time: the pool lets its workers
        # spin on all CPUs but one, so spinners never outnumber the CPUs.
        set_doorbell_spinners(1 if len(os.sched_getaffinity(0)) > 1 else 0)
        self.executor = ThreadPoolExecutor(max_workers=OPERATION_THREADS,
                                           thread_name_prefix="envd-op")
        self.context = zmq.Context()
        self._socket_files: list[tuple[str, int]] = []  # (path, inode) of our ipc sockets
        try:
            for endpoints, curve in self._socket_plan():
                sock = self._router(curve)
                # tcp first: ZAP_DOMAIN applies to the binds after it, and only
                # ipc peers carry credentials for the uid check (peer_auth.py).
                for endpoint in sorted(endpoints, key=lambda e: e.startswith("ipc://")):
                    if endpoint.startswith("ipc://"):
                        self._start_authenticator()
                        sock.setsockopt(zmq.ZAP_DOMAIN, IPC_DOMAIN)
                    prepare_ipc_endpoint(endpoint)
                    sock.bind(endpoint)
                    path = ipc_path(endpoint)
                    if path:
                        self._socket_files.append((path, os.stat(path).st_ino))
        except BaseException:
            self._close_transport()
            self.pool.close()
            self.instance.release()
            raise
        self._drain_scheduled = [False] * len(self.sockets)
        if len(self.sockets) > 1:
            self._routes = {}
        self.service = Service(self.config, self.pool, self.executor, self._send,
                               self.instance.segment_prefix, plugins=plugins,
                               step_latency=self.metrics.observe_step if self.metrics else None,
                               hosted=self.hosted)
        self.service.on_drained = self._stop
        self.service.fd_check = self._check_fds
        log.info("envd %s serving %s with %d thread(s), pid %d, lease timeout %g s",
                 __version__, " ".join(self.config.bind), self.config.threads, os.getpid(),
                 self.config.lease_timeout)
        log.info("open-file limit %d: at most %d connections (--max-connections), %d fds "
                 "reserved for the daemon itself", self.fd_limit,
                 self.connections.max_connections, self._fd_reserve)
        for endpoint in self.config.insecure_endpoints():
            log.warning("--insecure: %s is served without authentication; anyone who can "
                        "reach it may make envs and use this host's CPUs and memory (give "
                        "the daemon CURVE keys instead, see `envd keygen`)", endpoint)

    def _max_connections(self) -> int:
        """--max-connections, or its default from the open-file limit; never
        more than the fds the reserve leaves."""
        most = max(1, self.fd_limit - fd_reserve(self.fd_limit))
        wanted = self.config.max_connections or default_max_connections(self.fd_limit)
        if wanted > most:
            log.warning("--max-connections %d is more than the open-file limit %d allows "
                        "(%d are reserved for the daemon itself): using %d", wanted,
                        self.fd_limit, fd_reserve(self.fd_limit), most)
        return min(wanted, most)

    def _check_fds(self, makes_in_flight: int, workers_in_flight: int = 0,
                   num_workers: int = 0) -> None:
        """Refuse a make (LimitExceededError) when the fds it needs (a hosted
        make of num_workers workers: connections.make_fds) would eat into the
        reserve or the connection slots not in use, counting those of the
        makes in flight (workers_in_flight: the workers of the hosted ones;
        each has at least one, so FDS_PER_HOSTED_MAKE per worker bounds their
        extra fds).  Native sessions hold no fd once made; hosted ones hold a
        pidfd per worker, which open_fds() counts."""
        free = (self.fd_limit - self._fd_reserve - self.connections.free_slots()
                - open_fds() - FDS_PER_MAKE * makes_in_flight
                - (FDS_PER_HOSTED_MAKE + 1) * workers_in_flight)
        if free < make_fds(num_workers):
            raise LimitExceededError(
                f"the daemon is short of file descriptors: its open-file limit is "
                f"{self.fd_limit}, of which {self._fd_reserve} are reserved and "
                f"{self.connections.max_connections} are for connections (--max-connections); "
                "close envs you no longer use, or raise the daemon's limit (ulimit -n)")

    def _socket_plan(self) -> list[tuple[list[str], bool]]:
        """(endpoints, CURVE?) of each ROUTER socket to open: one plain socket
        for everything, or with CURVE keys the ipc endpoints on a plain one and
        the tcp endpoints on a CURVE one."""
        if not self.config.curve:
            return [(list(self.config.bind), False)]
        tcp = [e for e in self.config.bind if e.startswith("tcp://")]
        ipc = [e for e in self.config.bind if not e.startswith("tcp://")]
        if not tcp:
            log.warning("--curve-secret-key has no effect: no --bind endpoint is tcp "
                        "(ipc endpoints never use CURVE)")
        return [(endpoints, curve) for endpoints, curve in ((ipc, False), (tcp, True)) if endpoints]

    def _router(self, curve: bool) -> zmq.Socket:
        """A new ROUTER socket in self.sockets with the daemon's options; with
        curve, a CURVE server whose clients the ZAP handler checks."""
        sock = self.context.socket(zmq.ROUTER)
        self.sockets.append(sock)
        self.monitors.append(self._monitor(sock))
        # libzmq drops a peer that has not completed its ZMTP (and CURVE)
        # handshake by then; Connections.reap drops one that says no hello.
        sock.setsockopt(zmq.HANDSHAKE_IVL, max(1, round(self.config.hello_timeout * 1000)))
        # Replies to a client that vanished raise EHOSTUNREACH instead of
        # vanishing silently; oversized messages drop their sender.
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # At most REPLY_QUEUE replies queue per peer: with ROUTER_MANDATORY a
        # send to a full queue raises EAGAIN (instead of dropping the reply
        # silently), and Service drops that client (server/replies.py).
        sock.setsockopt(zmq.SNDHWM, protocol.REPLY_QUEUE)
        sock.setsockopt(zmq.MAXMSGSIZE, self.config.max_message_bytes)
        sock.setsockopt(zmq.LINGER, _LINGER_MS)
        sock.setsockopt(zmq.IPV6, 1)  # tcp://[::1]:P and [::]:P bind; IPv4 as before
        if curve:
            self._start_authenticator()
            self._admit_curve_keys()
            try:
                pair = self.config.curve_keys()
            except KeyFileError as exc:  # the config read it; it changed since
                raise RuntimeError(str(exc)) from None
            sock.setsockopt(zmq.CURVE_SERVER, 1)
            sock.setsockopt(zmq.CURVE_SECRETKEY, pair.secret)
            sock.setsockopt(zmq.CURVE_PUBLICKEY, pair.public)
            # Without a ZAP handler libzmq admits every CURVE client.  The
            # authenticator runs before the first bind; and in case it ever
            # stopped answering, a socket with a ZAP domain that enforces it
            # refuses clients instead.  "*" is the domain configure_curve
            # answers for.
            sock.setsockopt(zmq.ZAP_DOMAIN, CURVE_DOMAIN)
            try:
                sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
            except (zmq.ZMQError, AttributeError):  # a libzmq without the draft option
                pass
        return sock

    def _monitor(self, sock: zmq.Socket) -> zmq.Socket:
        """A monitor of sock's connections, started before it binds (no
        connection goes unseen).  Its queue has no high-water mark: libzmq
        drops the events of a full monitor queue, and a connection whose
        accept went unseen would never be counted or bound."""
        address = f"inproc://envd-monitor-{len(self.sockets)}"
        sock.monitor(address, _MONITOR_EVENTS)
        monitor = self.context.socket(zmq.PAIR)
        monitor.setsockopt(zmq.RCVHWM, 0)
        monitor.setsockopt(zmq.LINGER, 0)
        monitor.connect(address)
        return monitor

    def _start_authenticator(self) -> None:
        """The ZAP handler thread (server/peer_auth.py), once: it checks the uid
        of ipc peers and the keys of CURVE clients before libzmq accepts a
        message from them."""
        if self._authenticator is None:
            uids = self.config.ipc_uids()
            self._authenticator = PeerAuthenticator(self.context, uids)
            self._authenticator.start()
            log.info("ipc endpoints admit %s (--ipc-allowed-uids)",
                     "any uid the socket folder lets in" if uids is None
                     else "uid(s) " + ",".join(map(str, sorted(uids))))

    def _admit_curve_keys(self) -> None:
        """Let the ZAP handler admit the keys of --curve-allowed-clients."""
        allowed = self.config.curve_allowed_clients
        assert allowed is not None and self._authenticator is not None
        self._authenticator.configure_curve(domain=CURVE_DOMAIN.decode(), location=allowed)
        count = len(self._authenticator.certs.get("*", {}))
        if not count:  # the config checked the folder; it changed since
            raise RuntimeError(f"--curve-allowed-clients {allowed} holds no readable *.key "
                               "file; copy the clients' public .key files there")
        for path in (allowed, *self._key_files(allowed)):
            if writable_by_others(path):
                log.warning("--curve-allowed-clients: %s is writable by other users, who can "
                            "make the daemon admit their own keys; run chmod go-w %s",
                            path, path)
        log.info("tcp endpoints use CURVE: %d client key(s) admitted from %s (restart the "
                 "daemon after changing them)", count, allowed)

    @staticmethod
    def _key_files(folder: str) -> list[str]:
        return [os.path.join(folder, name) for name in sorted(os.listdir(folder))
                if name.endswith(".key")]

    # ---- serve --------------------------------------------------------------------------
    async def serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._stopped = self.loop.create_future()
        if self.metrics is not None:
            self.metrics.attach(self.service, self.loop)
        self._watcher = threading.Thread(target=self._watch_connections, name="envd-conn",
                                         daemon=True)
        self._watcher.start()
        for index, sock in enumerate(self.sockets):
            self.loop.add_reader(int(sock.getsockopt(zmq.FD)), self._drain_socket, index)
        self.loop.add_reader(self.pool.eventfd(), self.service.on_pool_event)
        self.service.fd_watch = (self.loop.add_reader, self.loop.remove_reader)
        self.service.reaper = reaper = WorkerReaper(self.loop.add_reader, self.loop.remove_reader)
        self.service.books.reaping = lambda: reaper.pending
        for signum in (signal.SIGTERM, signal.SIGINT):
            self.loop.add_signal_handler(signum, self._on_signal, signum)
        self._lease_timer()
        for index in range(len(self.sockets)):  # messages may have queued before the readers
            self._schedule_drain(index)
        await self._stopped

    def _lease_timer(self) -> None:
        interval = min(1.0, self.config.lease_timeout / 4)
        self._lease_handle = self.loop.call_later(interval, self._lease_timer)
        # Read what is queued first: after a long stall the heartbeats that
        # prove a client alive may be waiting in the sockets.
        for index in range(len(self.sockets)):
            self._drain_socket(index)
        self.service.collect_doorbell_steps()
        self.service.close_revoked_sessions()
        self.service.expire_silent_clients()
        self._prune_routes()
        self.connections.reap()
        self.connections.forget_orphans(self.service.clients)

    def _watch_connections(self) -> None:
        """The connection thread: hand every monitor event to Connections as
        it comes (a flood of connections is shed as fast as libzmq accepts
        it), until shutdown; then close the monitors, which it owns."""
        poller = zmq.Poller()
        for monitor in self.monitors:
            poller.register(monitor, zmq.POLLIN)
        try:
            while not self._stop_watching.is_set():
                for monitor, _ in poller.poll(_MONITOR_POLL_MS):
                    while monitor.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                        event = monitor.recv_multipart()[0]
                        kind = int.from_bytes(event[:2], "little")
                        fd = int.from_bytes(event[2:6], "little")
                        if kind == zmq.EVENT_ACCEPTED:
                            self.connections.accepted(fd)
                        elif kind == zmq.EVENT_DISCONNECTED:
                            self.connections.disconnected(fd)
        except Exception:  # a bug: the cap no longer holds, say so loudly
            log.exception("the connection thread stopped")
        finally:
            for monitor in self.monitors:
                monitor.close(linger=0)

    def _drain_socket(self, index: int = 0) -> None:
        self._drain_scheduled[index] = False
        if self.sockets[index].closed:  # a drain scheduled before shutdown closed it
            return
        for _ in range(_DRAIN_BATCH):
            if not self._read_one(index):
                return
        self._schedule_drain(index)  # more may be queued: let other callbacks run first

    def _read_one(self, index: int) -> bool:
        """Read and handle one message of socket index; False when none is queued."""
        sock = self.sockets[index]
        try:
            first = sock.recv(zmq.NOBLOCK, copy=False)  # a Frame: it knows its connection
        except zmq.Again:
            return False
        frames = [first.bytes]
        while sock.getsockopt(zmq.RCVMORE):
            frames.append(sock.recv())
        identity, fd = frames[0], first.get(zmq.SRCFD)
        if self._routes is not None and not self._route(self._routes, identity, index):
            return True
        if not self.connections.message(fd, identity):
            return True  # its connection is being shed: it makes no client
        self.service.handle(identity, frames[1:])
        if not self.connections.admitted(fd) and self._says_hello(identity, frames):
            self.connections.admit(fd)
        return True

    def _says_hello(self, identity: bytes, frames: list[bytes]) -> bool:
        """Whether a message (handled already) shows a peer that keeps to the
        protocol: a client that said hello, or a heartbeat for one."""
        if identity in self.service.clients:
            return True
        try:
            header = protocol.unpack(frames[1], self.config.header_bytes)
        except (IndexError, protocol.BadRequest):
            return False
        return header.get("type") == "heartbeat" and header.get("client") in self.service.clients

    def _schedule_drain(self, index: int = 0) -> None:
        if not self._drain_scheduled[index]:
            self._drain_scheduled[index] = True
            self.loop.call_soon(self._drain_socket, index)

    def _route(self, routes: dict[bytes, int], identity: bytes, index: int) -> bool:
        """Remember that identity speaks on socket index; False (drop the
        message) when it already speaks on the other socket.  Routing ids are
        unique within one ROUTER socket only, and Service leases sessions to
        them: a CURVE client sending an ipc client's id (or the reverse) must
        not reach that client's sessions.  Service's heartbeats name the client
        by its routing id, which is why the ids Service sees are the peers'
        own rather than ids with a socket prefix."""
        owner = routes.setdefault(identity, index)
        if owner == index:
            return True
        if identity not in self._misrouted:
            self._misrouted.add(identity)
            log.warning("dropped messages of routing id %s on the %s socket: the id is in use "
                        "on the %s socket", identity.hex()[:8], self._kind(index),
                        self._kind(owner))
        return False

    def _kind(self, index: int) -> str:
        return "CURVE (tcp)" if self.config.curve and index == len(self.sockets) - 1 else "plain"

    def _prune_routes(self) -> None:
        """Forget the routing ids of peers that are not Service's clients (gone,
        expired, or heartbeat sockets, which never say hello): their replies
        are sent while their request is handled, and a peer that speaks again
        is routed again."""
        if self._routes is not None:
            clients = self.service.clients
            self._routes = {i: s for i, s in self._routes.items() if i in clients}
            self._misrouted.clear()

    def _send(self, identity: bytes, reply: dict[str, Any]) -> bool:
        """Queue a reply (Service packed its header under "_header"); False
        when the peer's queue is full: it reads no replies."""
        blobs = reply.pop("_blobs", ())  # data frames after the header
        header = reply.pop("_header", None) or protocol.pack(reply)
        if reply.get("ok") is False:  # every error reply, whichever handler made it
            if self.metrics is not None:
                self.metrics.count_error(reply.get("code"))
            log.info("error reply: %s", reply.get("message"), extra={
                "event": "error_reply", "client": identity.hex()[:8],
                "request_id": reply.get("id"), "code": reply.get("code")})
        index = 0 if self._routes is None else self._routes.get(identity)
        if index is None:  # forgotten by _prune_routes: the client is gone
            log.debug("dropped a reply to %s: no longer connected", identity.hex()[:8])
            return True
        sock = self.sockets[index]
        delivered = True
        try:
            # Copied into the messages: a zero-copy send would have pyzmq free
            # the frames through a garbage-collector thread and context of its
            # own, started at the first big reply; a copy costs less than the
            # network the inline arrays then cross.
            sock.send_multipart([identity, header, *blobs], zmq.NOBLOCK)
        except zmq.Again:  # its queue is full: Service drops it (and logs that)
            log.debug("reply queue of %s is full: reply %s not sent", identity.hex()[:8],
                      reply.get("id"))
            delivered = False
        except zmq.ZMQError as exc:  # EHOSTUNREACH: the client is gone (its monitor says so)
            log.info("reply %s to %s lost: %s", reply.get("id"), identity.hex()[:8], exc)
        if sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:  # type: ignore[arg-type, operator]  # pyzmq's stub: any option's type
            self._schedule_drain(index)
        return delivered

    def _on_signal(self, signum: int) -> None:
        self._signals += 1
        if self._signals > 1:
            log.warning("second %s: exiting now", signal.Signals(signum).name)
            self.instance.remove_own_segments()  # also those of makes still running
            os._exit(1)
        log.info("%s: draining (a second signal forces exit)", signal.Signals(signum).name)
        self.service.start_draining()

    def _stop(self) -> None:
        if not self._stopped.done():
            self._stopped.set_result(None)

    # ---- shutdown ---------------------------------------------------------------------------
    def shutdown(self) -> None:
        if self.metrics is not None:
            self.metrics.close()  # first: no scrape waits on a loop that no longer runs
        loop = getattr(self, "loop", None)
        if loop is not None:
            self._lease_handle.cancel()
            for sock in self.sockets:
                loop.remove_reader(sock.getsockopt(zmq.FD))
            loop.remove_reader(self.pool.eventfd())
            self._answer_queued()
        self.executor.shutdown(wait=True)
        self.service.free_all()
        if self.service.reaper is not None:  # workers of closed sessions still exiting
            self.service.reaper.close()
        self.hosted.close()  # (every hosted session's workers are gone by now)
        self._close_transport()
        self.pool.close()
        self.instance.release()
        log.info("envd stopped")

    def _answer_queued(self) -> None:
        """Read the requests still queued on the sockets and answer each one
        (new work gets shutting_down: the service drains), until every socket
        stayed quiet for _QUEUED_QUIET_MS or _QUEUED_READ_S passed.  A request
        sent after that finds no daemon: the client sees the connection close."""
        self.service.draining = True
        poller = zmq.Poller()
        for sock in self.sockets:
            poller.register(sock, zmq.POLLIN)
        deadline = time.monotonic() + _QUEUED_READ_S
        answered = 0
        while time.monotonic() < deadline:
            ready = dict(poller.poll(_QUEUED_QUIET_MS))
            if not ready:
                break
            for index, sock in enumerate(self.sockets):
                while sock in ready and self._read_one(index):
                    answered += 1
        if answered:
            log.info("answered %d request(s) queued during the drain", answered)

    def _close_transport(self) -> None:
        self._stop_watching.set()
        if self._watcher is not None:
            self._watcher.join()
        else:  # never served: the monitors are still the main thread's
            for monitor in self.monitors:
                monitor.close(linger=0)
        for sock in self.sockets:
            sock.close(linger=_LINGER_MS)
        if self._authenticator is not None:
            # After the sockets (no handshake waits for it any more) and before
            # term(), which would wait for the authenticator's own sockets.
            self._authenticator.stop()
            self._authenticator = None
        self.context.term()
        # libzmq leaves ipc socket files behind; remove ours (the inode check
        # spares a file a newer daemon has bound since), so clients find no
        # socket and fail at once instead of waiting for a reply.
        for path, inode in self._socket_files:
            try:
                if os.stat(path).st_ino == inode:
                    os.unlink(path)
            except OSError:
                pass

    async def run(self) -> int:
        self.startup()
        try:
            await self.serve()
        finally:
            self.shutdown()
        return self.exit_status


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop when it is installed, else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def note_threads_over_cpus(config: Config) -> None:
    """Log one line when --threads exceeds the CPUs this process may run on:
    threads beyond them cannot step at the same time (and the pool lets at
    most one spin per CPU), so they add context switches, not speed."""
    cpus = len(os.sched_getaffinity(0))
    if config.threads > cpus:
        log.warning("--threads %d is more than the %d CPU(s) this daemon may run on: at most "
                    "%d threads step at once (--threads %d, the default, uses them all)",
                    config.threads, cpus, cpus, cpus)


def run_daemon(config: Config) -> int:
    """Run a daemon until it is drained by a signal; its exit status."""
    logs.configure(config.log_level, config.log_format)
    note_threads_over_cpus(config)
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(Daemon(config).run())
    finally:
        asyncio.set_event_loop(None)
        loop.close()
