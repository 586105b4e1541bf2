"""The daemon: startup -> serve -> shutdown around one ROUTER socket and one pool.

Event loop (asyncio on uvloop; plain asyncio when uvloop is missing) with two
readers and no busy polling:
  - the ROUTER socket's ZMQ_FD.  It is edge-triggered: it signals when the
    socket's state may have changed, so the reader drains every queued
    message, and after each send the daemon checks ZMQ_EVENTS again (a send
    can consume the edge of a message that arrived meanwhile);
  - the pool's eventfd, readable when a submitted step finished.

Signals: the first SIGTERM or SIGINT drains (new work is refused, running
steps/resets/makes finish and get their replies, every segment is freed,
exit status 0); a second one unlinks the segments and exits at once with
status 1.  At startup, segments of dead daemons are removed.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import stat
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import zmq

from envd import __version__, protocol
from envd.protocol import default_endpoint
from envd.native.native_vec import NativePool
from envd.server import logs
from envd.server.config import Config
from envd.server.plugins import load_plugins
from envd.server.service import Service
from envd.server.stale_segments import Instance, remove_stale_segments

log = logging.getLogger("envd.server")

#: Messages handled per reader callback before other callbacks get a turn.
_DRAIN_BATCH = 64
#: How long shutdown waits to flush the last replies.
_LINGER_MS = 2000


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
        if folder == os.path.dirname(default_endpoint()[len("ipc://"):]):
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
        self._drain_scheduled = False
        self.metrics = None  # envd.server.metrics.Metrics with --metrics-port

    # ---- startup ---------------------------------------------------------------------
    def startup(self) -> None:
        if self.config.metrics_port:  # first: a taken port refuses to start, with nothing to undo
            try:
                from envd.server.metrics import Metrics
            except ImportError as exc:
                raise RuntimeError(f"--metrics-port needs prometheus-client ({exc}); install "
                                   "it with pip install 'envd[metrics]'") from None
            self.metrics = Metrics(self.config.threads)
            self.metrics.serve(self.config.metrics_port, self.config.metrics_bind)
        try:
            self._startup()
        except BaseException:
            if self.metrics is not None:
                self.metrics.close()
            raise

    def _startup(self) -> None:
        remove_stale_segments()
        plugins = load_plugins(self.config.plugins)  # before serving: clients see every env
        self.instance = Instance()
        self.pool = NativePool(self.config.threads,
                               list(self.config.pin_cpus) if self.config.pin_cpus else None)
        self.executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="envd-op")
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.ROUTER)
        # Replies to a client that vanished raise EHOSTUNREACH instead of
        # vanishing silently; oversized messages drop their sender.
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.socket.setsockopt(zmq.MAXMSGSIZE, self.config.max_message_bytes)
        self.socket.setsockopt(zmq.LINGER, _LINGER_MS)
        self._socket_files: list[tuple[str, int]] = []  # (path, inode) of our ipc sockets
        try:
            for endpoint in self.config.bind:
                prepare_ipc_endpoint(endpoint)
                self.socket.bind(endpoint)
                if ipc_path(endpoint):
                    self._socket_files.append((ipc_path(endpoint), os.stat(ipc_path(endpoint)).st_ino))
        except BaseException:
            self._close_transport()
            self.pool.close()
            self.instance.release()
            raise
        self.service = Service(self.config, self.pool, self.executor, self._send,
                               self.instance.segment_prefix, plugins=plugins,
                               step_latency=self.metrics.observe_step if self.metrics else None)
        self.service.on_drained = self._stop
        log.info("envd %s serving %s with %d thread(s), pid %d, lease timeout %g s",
                 __version__, " ".join(self.config.bind), self.config.threads, os.getpid(),
                 self.config.lease_timeout)

    # ---- serve --------------------------------------------------------------------------
    async def serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._stopped = self.loop.create_future()
        if self.metrics is not None:
            self.metrics.attach(self.service, self.loop)
        self.loop.add_reader(self.socket.getsockopt(zmq.FD), self._drain_socket)
        self.loop.add_reader(self.pool.eventfd(), self.service.on_pool_event)
        for signum in (signal.SIGTERM, signal.SIGINT):
            self.loop.add_signal_handler(signum, self._on_signal, signum)
        self._lease_timer()
        self._schedule_drain()  # messages may have queued before the reader existed
        await self._stopped

    def _lease_timer(self) -> None:
        interval = min(1.0, self.config.lease_timeout / 4)
        self._lease_handle = self.loop.call_later(interval, self._lease_timer)
        # Read what is queued first: after a long stall the heartbeats that
        # prove a client alive may be waiting in the socket.
        self._drain_socket()
        self.service.expire_silent_clients()

    def _drain_socket(self) -> None:
        self._drain_scheduled = False
        for _ in range(_DRAIN_BATCH):
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.service.handle(frames[0], frames[1:])
        self._schedule_drain()  # more may be queued: let other callbacks run first

    def _schedule_drain(self) -> None:
        if not self._drain_scheduled:
            self._drain_scheduled = True
            self.loop.call_soon(self._drain_socket)

    def _send(self, identity: bytes, reply: dict[str, Any]) -> None:
        blobs = reply.pop("_blobs", ())  # data frames after the header
        if reply.get("ok") is False:  # every error reply, whichever handler made it
            if self.metrics is not None:
                self.metrics.count_error(reply.get("code"))
            log.info("error reply: %s", reply.get("message"), extra={
                "event": "error_reply", "client": identity.hex()[:8],
                "request_id": reply.get("id"), "code": reply.get("code")})
        try:
            self.socket.send_multipart([identity, protocol.pack(reply), *blobs], zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # the client is gone, or reads no replies
            log.debug("dropped a reply to %s: %s", identity.hex()[:8], exc)
        if self.socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            self._schedule_drain()

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
            loop.remove_reader(self.socket.getsockopt(zmq.FD))
            loop.remove_reader(self.pool.eventfd())
        self.executor.shutdown(wait=True)
        self.service.free_all()
        self._close_transport()
        self.pool.close()
        self.instance.release()
        log.info("envd stopped")

    def _close_transport(self) -> None:
        self.socket.close(linger=_LINGER_MS)
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


def run_daemon(config: Config) -> int:
    """Run a daemon until it is drained by a signal; its exit status."""
    logs.configure(config.log_level, config.log_format)
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(Daemon(config).run())
    finally:
        asyncio.set_event_loop(None)
        loop.close()
