"""The trainer's connection to a daemon: ``envd.connect()`` returns a Client.

One Client is one DEALER socket with a random routing id (the identity the
daemon leases sessions to), a monitor that reports a broken connection or a
failed CURVE handshake at once, and a heartbeat thread (see heartbeat.py).
Requests are synchronous: send, then wait for the reply with the same id, at
most ``timeout`` seconds.  Replies to earlier requests that timed out are
recognised by their id and dropped.  A Client may be shared by threads;
requests are serialised.

Unread replies (docs/protocol.md): every request acknowledges ("ack") the
token of the last large reply read, so the daemon's books of unread replies
stay empty, and posted requests (async sends) are flow-controlled: at most
protocol.POSTED_WINDOW of them wait for their replies; the next one first
reads replies until there is room.
"""
from __future__ import annotations

import itertools
import os
import socket
import threading
import time
import weakref
from typing import Any, Callable, Sequence

import msgpack
import numpy as np
import zmq
from gymnasium.vector import AutoresetMode
from zmq.utils.monitor import recv_monitor_message

from envd import __version__, _native_facts, keys, ownership, protocol
from envd.client import doorbell
from envd.client.heartbeat import Heartbeat
from envd.client.remote_vector_env import RemoteVecEnv
from envd.errors import (AuthenticationError, ConnectionLostError, EnvdError, EnvdTimeoutError,
                         EnvStateError, InvalidArgumentError, LimitExceededError,
                         ProtocolError, UnknownSessionError, UntrustedPathError)
from envd.vector_base import (autoreset_mode_name, check_int, episode_statistics_key,
                              parse_autoreset_mode, seed_list)

#: The most envs one make may ask for (the native vec's limit, ENVD_VEC_MAX_ENVS).
MAX_NUM_ENVS = _native_facts.VEC_MAX_ENVS

#: What the client's monitor reports: a broken connection, and the ways a
#: handshake fails (which events each CURVE mistake gives: see _handshake_error).
_MONITOR_EVENTS = (zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                   | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH)


def _curve_options(endpoint: str, server_key: Any, client_key: Any) -> dict[int, bytes]:
    """The CURVE socket options for endpoint: empty without keys and for ipc
    endpoints (the daemon serves those without CURVE; keys are ignored there).
    A tcp endpoint with keys needs both: the daemon admits only the client
    keys it lists, so a made-up pair would never get in."""
    names = {"server_key": "server_key", "client_key": "client_key"}
    if server_key is None and os.environ.get("ENVD_SERVER_KEY"):
        server_key, names["server_key"] = os.environ["ENVD_SERVER_KEY"], "ENVD_SERVER_KEY"
    if client_key is None and os.environ.get("ENVD_CLIENT_KEY"):
        client_key, names["client_key"] = os.environ["ENVD_CLIENT_KEY"], "ENVD_CLIENT_KEY"
    if not endpoint.startswith("tcp://") or (server_key is None and client_key is None):
        return {}
    if server_key is None or client_key is None:
        given, missing = (("server_key", "client_key") if client_key is None
                          else ("client_key", "server_key"))
        raise InvalidArgumentError(
            f"CURVE needs both keys, got {names[given]} without {missing} (or ENVD_"
            f"{missing.upper()}): server_key is the daemon's public .key file (or its 40-"
            "character text), client_key this client's .key_secret file, whose .key must be "
            "in the daemon's --curve-allowed-clients directory; create a pair with "
            "`envd keygen`")
    if not isinstance(server_key, (str, bytes, os.PathLike)):
        raise InvalidArgumentError("server_key must be a path (str or os.PathLike) or the "
                                   "daemon's 40-character Z85 public key (str or bytes), got "
                                   f"a {type(server_key).__name__}")
    if not isinstance(client_key, (str, os.PathLike)):
        raise InvalidArgumentError("client_key must be the path (str or os.PathLike) of this "
                                   f"client's .key_secret file, got a {type(client_key).__name__}")
    try:
        server = keys.load_public_key(server_key, names["server_key"])
        pair = keys.load_key_pair(client_key, names["client_key"])
    except keys.KeyFileError as exc:
        raise InvalidArgumentError(str(exc)) from None
    return {zmq.CURVE_SERVERKEY: server, zmq.CURVE_PUBLICKEY: pair.public,
            zmq.CURVE_SECRETKEY: pair.secret}


def _wire(name: str, value: Any) -> Any:
    """value in msgpack's types (numpy scalars and arrays become Python ones)."""
    if isinstance(value, (np.generic, np.ndarray)):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_wire(name, v) for v in value]
    if isinstance(value, dict):
        return {k: _wire(name, v) for k, v in value.items()}
    if isinstance(value, int) and not isinstance(value, bool) and not -2**63 <= value < 2**64:
        raise InvalidArgumentError(f"{name}: the int {value} is beyond what the daemon accepts "
                                   "(-2**63 <= value < 2**64)")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise InvalidArgumentError(f"{name}: a {type(value).__name__} cannot be sent to the daemon")


class _Connection:
    """The sockets and the heartbeat thread of a Client, released once by
    Client.close, or by a finalizer when a Client is garbage-collected unclosed
    (then the daemon frees its sessions when the lease runs out)."""

    def __init__(self, context: zmq.Context, sock: zmq.Socket, monitor: zmq.Socket):
        self.context, self.socket, self.monitor = context, sock, monitor
        self.heartbeat: Heartbeat | None = None

    def stop_heartbeat(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()
            self.heartbeat = None

    def release(self) -> None:
        self.stop_heartbeat()
        self.socket.disable_monitor()
        self.monitor.close(linger=0)
        self.socket.close(linger=0)
        self.context.term()


#: The start of a ZMTP 3 greeting: signature and major version.  A libzmq
#: peer answers it with its whole greeting, which names its mechanism.
_ZMTP3_GREETING_START = b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03"


#: How long the probe waits to see whether the daemon hangs up on it.
_PROBE_HANG_UP_S = 0.5


def _daemon_mechanism(endpoint: str, timeout: float) -> bytes | None:
    """The security mechanism (b"CURVE", b"NULL") the ZeroMQ socket at a tcp
    endpoint announces in its ZMTP greeting; None when it cannot be told.

    Sending the greeting's first 11 bytes only, then hanging up, keeps the
    daemon from seeing a mechanism to refuse: it sends its full 64-byte
    greeting (mechanism at bytes 12-31) and then just sees a peer leave."""
    if not endpoint.startswith("tcp://"):
        return None  # ipc: no CURVE, and nothing to probe
    address = endpoint[len("tcp://"):].rpartition(";")[2]  # tcp://source;host:port
    host, _, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as probe:
            probe.sendall(_ZMTP3_GREETING_START)
            greeting = b""
            while len(greeting) < 64:
                chunk = probe.recv(64 - len(greeting))
                if not chunk:
                    break
                greeting += chunk
            # A daemon at its --max-connections greets, then hangs up on
            # every new connection: that says nothing about keys.
            probe.settimeout(_PROBE_HANG_UP_S)
            try:
                if probe.recv(1) == b"":
                    return None
            except socket.timeout:
                pass
    except (OSError, ValueError):
        return None
    if len(greeting) < 32 or greeting[0] != 0xFF or greeting[10] < 3:
        return None
    return greeting[12:32].rstrip(b"\x00")


def _check_timeout(timeout: float) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < 1e7:
        raise InvalidArgumentError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return float(timeout)


class Client:
    """A connection to one envd daemon (see envd.connect)."""

    def __init__(self, endpoint: str | None = None, *, timeout: float = 30.0,
                 name: str | None = None, server_key: str | bytes | os.PathLike | None = None,
                 client_key: str | os.PathLike | None = None):
        self.endpoint = endpoint or protocol.default_endpoint()
        self.timeout = _check_timeout(timeout)
        self.closed = False
        self._closing = False  # close() is closing the envs: they need not tell the daemon
        self._lost = False     # the connection broke: the daemon and its sessions are gone
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._envs: weakref.WeakSet = weakref.WeakSet()
        self._orphans: list[str] = []  # sessions of envs garbage-collected unclosed
        self._abandoned: set[int] = set()  # ids of makes that timed out
        # requests nobody waits for (timed-out calls, posted sends): id -> on reply
        self._awaited: dict[int, Callable[[dict[str, Any]], None]] = {}
        self._posted: set[int] = set()  # ids of posted requests whose replies are unread
        self._ack: int | None = None    # token of the last large reply read
        self.server_info: dict[str, Any] = {}
        self._check_endpoint()
        self._curve = _curve_options(self.endpoint, server_key, client_key)
        context = zmq.Context()
        self._socket = context.socket(zmq.DEALER)
        self.client_id = b"\x01" + os.urandom(15)  # ZeroMQ reserves ids starting with 0
        self._socket.setsockopt(zmq.ROUTING_ID, self.client_id)
        self._socket.setsockopt(zmq.LINGER, 0)
        # IPV6: tcp endpoints may name IPv6 addresses (dns+tcp:// resolves AAAA
        # records too); IPv4 addresses work as before.
        self._socket_options = {zmq.IPV6: 1, **self._curve}
        for option, value in self._socket_options.items():
            self._socket.setsockopt(option, value)
        self._monitor = self._socket.get_monitor_socket(_MONITOR_EVENTS)
        self._connection = _Connection(context, self._socket, self._monitor)
        self._release = weakref.finalize(self, self._connection.release)
        self._poller = zmq.Poller()
        self._poller.register(self._socket, zmq.POLLIN)
        self._poller.register(self._monitor, zmq.POLLIN)
        try:
            self._socket.connect(self.endpoint)
            self.server_info = self._request({
                "type": "hello", "version": protocol.PROTOCOL_VERSION,
                "client_name": name or f"envd {__version__} pid {os.getpid()}"})
        except EnvdTimeoutError:
            self._teardown()
            raise ConnectionLostError(
                f"no envd daemon answered at {self.endpoint} within {self.timeout:g} s; "
                "start one with `envd --threads N`") from None
        except BaseException:
            self._teardown()
            raise
        self._connection.heartbeat = Heartbeat(context, self.endpoint, self.client_id,
                                               float(self.server_info["heartbeat_interval"]),
                                               socket_options=self._socket_options)
        self._connection.heartbeat.start()

    def _check_endpoint(self) -> None:
        if not isinstance(self.endpoint, str) or not self.endpoint.startswith(("ipc://", "tcp://")):
            raise InvalidArgumentError(
                f"endpoint must be 'ipc:///path' or 'tcp://host:port', got {self.endpoint!r}")
        path = self.endpoint[len("ipc://"):]
        if not self.endpoint.startswith("ipc://") or path.startswith("@"):
            return
        _check_default_folder(self.endpoint, os.path.dirname(path))
        # Fail at once, not after a timeout, when nothing listens on the socket file.
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(self.timeout)  # a stopped daemon's full backlog must not hang us
        try:
            probe.connect(path)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            reason = "does not exist" if isinstance(exc, FileNotFoundError) else "has no listener"
            raise ConnectionLostError(
                f"no envd daemon at {self.endpoint}: {path} {reason}; start one with "
                "`envd --threads N` (or set ENVD_ENDPOINT to the daemon's endpoint)") from None
        except PermissionError:
            raise ConnectionLostError(
                f"permission denied connecting to {path}: the daemon at {self.endpoint} "
                f"belongs to another user (this process runs as uid {os.getuid()}); start "
                "your own daemon, or use one whose socket folder lets you in") from None
        except OSError:
            pass  # e.g. a path too long for AF_UNIX: let ZeroMQ report it
        finally:
            probe.close()

    # ---- requests -------------------------------------------------------------------
    def _request(self, header: dict[str, Any], blobs: Sequence[bytes] = (),
                 timeout: float | None = None) -> dict[str, Any]:
        """Send one request and return its ok reply; raise the error of an
        error reply, EnvdTimeoutError, or ConnectionLostError."""
        with self._lock:
            request_id = self._send_request(header, blobs)
            try:
                return self._wait_reply(request_id, header["type"],
                                        self.timeout if timeout is None else timeout)
            except EnvdTimeoutError:
                if header["type"] == "make":  # its late reply names a session to close
                    self._abandoned.add(request_id)
                raise

    def _post(self, header: dict[str, Any], blobs: Sequence[bytes],
              on_reply: Callable[[dict[str, Any]], None]) -> None:
        """Send one request without waiting for its reply: on_reply(reply)
        runs when the reply is read.  For a request the daemon answers at once
        (send), that is at the latest while waiting for the reply of the next
        request: the daemon reads a connection's requests in order."""
        with self._lock:
            self._make_room(header["type"])
            request_id = self._send_request(header, blobs)
            self._awaited[request_id] = on_reply
            self._posted.add(request_id)

    def _make_room(self, kind: str) -> None:
        """Read replies until fewer than POSTED_WINDOW posted requests wait
        for theirs (lock held): the daemon queues only so many replies for a
        client that does not read them, and drops it beyond."""
        deadline = time.monotonic() + self.timeout
        while len(self._posted) >= protocol.POSTED_WINDOW:
            self._read_monitor()
            remaining = deadline - time.monotonic()
            if self._socket.poll(max(0.0, min(remaining, 0.1)) * 1000):
                self._late_reply(self._recv_reply())
                continue
            if self._lost:
                raise ConnectionLostError(
                    f"lost the connection to the daemon at {self.endpoint} with "
                    f"{len(self._posted)} posted requests unanswered; the daemon stopped or "
                    "crashed, and its sessions are gone")
            if remaining <= 0:
                raise EnvdTimeoutError(
                    f"{len(self._posted)} posted requests to the daemon at {self.endpoint} "
                    f"got no reply within {self.timeout:g} s (Client timeout), so this "
                    f"{kind!r} was not sent: the daemon is stuck or overloaded")

    def _send_request(self, header: dict[str, Any], blobs: Sequence[bytes]) -> int:
        """Put one request on the socket (lock held); its id."""
        if self.closed:
            raise EnvStateError(f"this client of {self.endpoint} is closed")
        self._read_monitor()
        if self._lost and header["type"] == "hello":
            raise self._closed_before_hello()
        if self._lost:
            raise ConnectionLostError(
                f"the connection to the daemon at {self.endpoint} was lost and its sessions "
                "with it; connect again")
        self._send_orphan_closes()
        request_id = header["id"] = next(self._ids)
        if self._ack is not None:
            header["ack"] = self._ack
        packed = protocol.pack(header)
        self._check_size(len(packed) + sum(map(len, blobs)), header["type"])
        if blobs:
            self._socket.send_multipart([packed, *blobs], copy=False)
        else:  # the hot path: one small frame, copied (cheaper than zero-copy here)
            self._socket.send(packed)
        return request_id

    def _closed_before_hello(self) -> ConnectionLostError:
        """The daemon hung up before hello was answered: at its connection
        cap (it drops new connections at once), or stopping."""
        return ConnectionLostError(
            f"the daemon at {self.endpoint} closed the connection before it answered hello: "
            "it holds its maximum of connections (--max-connections) or is stopping; try "
            "again later")

    def _check_size(self, size: int, kind: str) -> None:
        """Refuse what the daemon would drop the connection for."""
        limit = self.server_info.get("limits", {}).get("max_message_bytes")
        if limit is not None and size > limit:
            raise LimitExceededError(
                f"a {kind!r} message of {size} bytes is over the daemon's limit of {limit} "
                "(--max-message-bytes)")

    def _wait_reply(self, request_id: int, kind: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise EnvdTimeoutError(
                    f"no reply to {kind!r} from the daemon at {self.endpoint} within "
                    f"{timeout:g} s (Client timeout): the daemon is stuck or overloaded, or "
                    "never got the request")
            events = dict(self._poller.poll(remaining * 1000))
            if self._socket in events:
                # First: a daemon that answered and then exited (a drain) sends
                # the reply before the disconnect; both may be ready at once.
                reply = self._recv_reply()
                if reply.get("id") != request_id:
                    self._late_reply(reply)
                    continue
                if reply.get("ok"):
                    return reply
                protocol.raise_error(reply)
            event = recv_monitor_message(self._monitor) if self._monitor in events else None
            if event is not None and event["event"] == zmq.EVENT_DISCONNECTED:
                self._lost = True
                self._connection.stop_heartbeat()  # the lease goes with the sessions
                if self._socket.poll(0):
                    continue  # what it sent before it went is still ours to read
                if kind == "hello":
                    raise self._closed_before_hello()
                raise ConnectionLostError(
                    f"lost the connection to the daemon at {self.endpoint} while waiting for "
                    f"the reply to {kind!r}; the daemon stopped or crashed, and its sessions "
                    "are gone")
            failure = self._handshake_error(event) if event is not None else None
            if failure is not None:
                self._lost = True
                self._connection.stop_heartbeat()
                raise failure

    def _read_monitor(self) -> None:
        """Take in what the monitor reported since the last request (lock
        held): a disconnect means the daemon is gone (a new one at the same
        endpoint would otherwise get this request); a failed handshake raises."""
        while self._monitor.poll(0):
            event = recv_monitor_message(self._monitor)
            if event["event"] == zmq.EVENT_DISCONNECTED:
                self._lost = True
                self._connection.stop_heartbeat()
                continue
            failure = self._handshake_error(event)
            if failure is not None:
                self._lost = True
                self._connection.stop_heartbeat()
                raise failure

    def _check_alive(self) -> None:
        """Raise ConnectionLostError if the monitor reported the daemon gone,
        without waiting (for callers that wait elsewhere: the fast path).  A
        request in progress on another thread reads the monitor itself."""
        if not self._lost and self._lock.acquire(blocking=False):
            try:
                if not self.closed:
                    self._read_monitor()
            finally:
                self._lock.release()
        if self._lost:
            raise ConnectionLostError(
                f"lost the connection to the daemon at {self.endpoint} while waiting for a "
                "fast-path request; the daemon stopped or crashed, and its sessions are gone")

    def _handshake_error(self, event: dict[str, Any]) -> AuthenticationError | None:
        """The error of a failed handshake the monitor reported, or None for an
        event that says nothing about keys.  What a client sees with libzmq 4.3:
          - its key is not in --curve-allowed-clients: HANDSHAKE_FAILED_AUTH
            (the ZAP handler's status 400), and libzmq gives up;
          - a wrong server key: HANDSHAKE_FAILED_NO_DETAIL (the daemon cannot
            decrypt the HELLO and hangs up: EPIPE), again at every retry;
          - CURVE on one side only: HANDSHAKE_FAILED_PROTOCOL with
            ZMTP_MECHANISM_MISMATCH, but as often NO_DETAIL first (the daemon
            hangs up before its greeting reaches the client), and sometimes
            only NO_DETAILs for several retries;
          - a daemon at its --max-connections: NO_DETAIL, and no greeting for
            the probe either (it hangs up on every new connection until a
            slot frees): not a key problem, so libzmq retries.
        So AUTH and the mismatch are answers, while a NO_DETAIL is ambiguous:
        then _daemon_mechanism asks the daemon whether it speaks CURVE.  Each
        event comes before the DISCONNECTED of the same attempt: raising at
        the first makes the rejection fast."""
        kind, value = event["event"], event["value"]
        if kind not in (zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                        zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL):
            return None
        if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            mechanism = b"CURVE" if self._curve else b"NULL"
        elif value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
            mechanism = b"NULL" if self._curve else b"CURVE"
        else:
            mechanism = _daemon_mechanism(self.endpoint, min(self.timeout, 5.0))
            if mechanism is None:
                # No greeting at all: the daemon hung up at once, as it does
                # for a connection over its --max-connections; libzmq
                # retries, and the request's timeout bounds the wait.
                return None
        where = f"the daemon at {self.endpoint}"
        if not self._curve:
            if mechanism == b"CURVE":
                return AuthenticationError(
                    f"{where} requires CURVE authentication: pass server_key= (the daemon's "
                    "public .key file) and client_key= (this client's .key_secret file, whose "
                    ".key must be in the daemon's --curve-allowed-clients directory) to "
                    "envd.connect, or set ENVD_SERVER_KEY and ENVD_CLIENT_KEY (`envd status "
                    "--server-key --client-key`); create a pair with `envd keygen`")
            if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH and self.endpoint.startswith("ipc://"):
                return AuthenticationError(
                    f"{where} refused this process's user (uid {os.geteuid()}; ZAP status "
                    f"{value}): it admits only the uids of its --ipc-allowed-uids (by default "
                    "its own user and root); run the trainer as the daemon's user, or start "
                    "the daemon with --ipc-allowed-uids listing this uid")
            if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                return AuthenticationError(f"{where} refused this client (ZAP status {value})")
            return None  # a connection that broke during the handshake: libzmq retries
        if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            public = self._curve[zmq.CURVE_PUBLICKEY].decode()
            return AuthenticationError(
                f"{where} refused this client's CURVE key {public} (status {value}): that "
                "public key must be in a .key file in the daemon's --curve-allowed-clients "
                "directory (copy this client's .key file there and restart the daemon), and "
                "client_key (ENVD_CLIENT_KEY) must be this client's .key_secret file")
        if mechanism == b"NULL":
            return AuthenticationError(
                f"{where} does not use CURVE (it runs without --curve-secret-key), but this "
                "client gave keys: connect without server_key/client_key (unset "
                "ENVD_SERVER_KEY and ENVD_CLIENT_KEY), or restart the daemon with keys")
        check = ("check that server_key (ENVD_SERVER_KEY) is the daemon's public key: the "
                 ".key file `envd keygen` wrote next to the daemon's --curve-secret-key file")
        if mechanism == b"CURVE":
            return AuthenticationError(f"{where} uses CURVE but hung up during the handshake, "
                                       f"as it does for a wrong server key; {check}")
        return AuthenticationError(f"the CURVE handshake with {where} failed; {check}, and "
                                   "that the daemon runs with --curve-secret-key")

    def _late_reply(self, reply: dict[str, Any]) -> None:
        """A reply to a request that timed out, or to an orphan close.  A late
        make still made a session, which nobody will use: close it.  A late
        step or reset frees its env's buffers."""
        request_id = reply.get("id")
        if request_id in self._abandoned:
            self._abandoned.discard(request_id)
            if reply.get("ok") and isinstance(reply.get("session"), str):
                self._orphans.append(reply["session"])
        self._posted.discard(request_id)
        callback = self._awaited.pop(request_id, None)
        if callback is not None:
            callback(reply)

    def _await_late_reply(self, request_id: int,
                          callback: Callable[[dict[str, Any]], None]) -> None:
        self._awaited[request_id] = callback

    def _read_late_replies(self, wait: float = 0.0) -> None:
        """Handle the replies that arrived for requests nobody waits for
        (timed out, or posted); wait up to `wait` seconds for the first."""
        with self._lock:
            timeout_ms = wait * 1000
            while not self.closed and self._socket.poll(timeout_ms):
                self._late_reply(self._recv_reply())
                timeout_ms = 0

    def _recv_reply(self) -> dict[str, Any]:
        """One reply: its header, with its data frames (if any) under "_blobs"
        as memoryviews of the received frames (not copied: the inline
        transport's arrays can be large)."""
        header = self._socket.recv()
        blobs = []
        while self._socket.getsockopt(zmq.RCVMORE):  # all of them, whatever the header holds
            blobs.append(self._socket.recv(copy=False).buffer)
        reply = msgpack.unpackb(header, raw=False)
        if isinstance(reply.get("token"), int):  # a large reply: acknowledged from now on
            self._ack = reply["token"]
        if reply.get("code") == "connection_lost":  # the daemon dropped this connection
            self._lost = True
            self._connection.stop_heartbeat()
        if blobs:
            reply["_blobs"] = blobs
        return reply
    def _send_orphan_closes(self) -> None:
        """Close sessions of envs that were garbage-collected without close()
        (their __del__ cannot talk to the socket: it may run in any thread)."""
        while self._orphans and len(self._posted) < protocol.POSTED_WINDOW:
            session = self._orphans.pop()
            request_id = next(self._ids)
            header = {"type": "close", "id": request_id, "session": session}
            if self._ack is not None:
                header["ack"] = self._ack
            self._socket.send(protocol.pack(header))
            self._posted.add(request_id)  # its reply is read as a late one

    # ---- public API ------------------------------------------------------------------------
    def make(self, env_id: str, num_envs: int, *, seed: int | Sequence[int] | None = None,
             autoreset_mode: str | AutoresetMode = "next_step",
             max_episode_steps: int | None = None, copy: bool = False,
             episode_statistics: bool | str = True, batch_size: int | None = None,
             transport: str | None = None, fast_path: bool | None = None,
             render_mode: str | None = None, **env_kwargs: Any) -> RemoteVecEnv:
        """Make num_envs instances of env_id in the daemon.  Arguments and the
        returned VecEnv are those of the in-process envd.make (without the
        thread options: the daemon's pool steps every session).

        transport (default: ENVD_TRANSPORT, else "auto") says how the arrays
        travel: "shm" maps the session's shared memory (the daemon on this
        host, same IPC namespace and user; the arrays the env returns are
        views of it), "inline" sends them over the socket as data frames, and
        "auto" tries shm and falls back to inline when this process cannot
        map the segment.  ``env.transport`` says which one was taken.

        fast_path: steps, sends and recvs bypass the socket (a doorbell in
        shared memory served by a native thread of the daemon; sessions over
        shm on x86-64 Linux).  None (default): taken when the daemon offers it, unless
        ENVD_FAST_PATH=0; True: required (InvalidArgumentError or the daemon's
        refusal otherwise); False: never.  ``env.fast_path`` says which.

        render_mode: None, or "rgb_array" for an env that renders: render()
        then asks the daemon for every env's frame (drawn in its native core;
        they come back in the reply, so their bytes must fit the daemon's
        --max-message-bytes)."""
        # The checks the daemon cannot see as the caller wrote them (types
        # msgpack would change or cannot carry), with envd.make's messages.
        if not isinstance(env_id, str):
            raise InvalidArgumentError(f"env_id must be a str, got {type(env_id).__name__}")
        if transport is None:
            transport = os.environ.get("ENVD_TRANSPORT") or "auto"
        if transport not in protocol.TRANSPORTS:
            raise InvalidArgumentError(
                f"transport must be one of {', '.join(protocol.TRANSPORTS)} (or ENVD_TRANSPORT "
                f"unset), got {transport!r}")
        num_envs = check_int("num_envs", num_envs, 1, MAX_NUM_ENVS)
        episode_statistics_key(episode_statistics)  # refused before the daemon makes anything
        if seed is not None:
            seed_list(seed, num_envs)
        mode = parse_autoreset_mode(autoreset_mode)
        header = {"type": "make", "env_id": env_id, "num_envs": num_envs,
                  "autoreset_mode": autoreset_mode_name(mode),
                  "seed": _wire("seed", seed),
                  "max_episode_steps": _wire("max_episode_steps", max_episode_steps),
                  "env_kwargs": _wire("env_kwargs", env_kwargs)}
        if batch_size is not None:  # absent unless asked: a daemon without async mode still makes
            header["batch_size"] = _wire("batch_size", batch_size)
        if render_mode is not None:  # likewise for a daemon without rendering
            header["render_mode"] = _wire("render_mode", render_mode)
        reply = self._request(header)
        try:
            env = RemoteVecEnv(self, reply, num_envs, mode, copy, episode_statistics, transport)
        except BaseException:
            self._close_session(reply["session"])
            raise
        self._envs.add(env)
        if fast_path is None:
            fast_path = None if os.environ.get("ENVD_FAST_PATH", "1") != "0" else False
        if fast_path is not False:
            try:
                self._start_fast_path(env, required=fast_path is True)
            except BaseException:
                env.close()
                raise
        return env

    def _start_fast_path(self, env: RemoteVecEnv, required: bool) -> None:
        """Ask the daemon to serve env's steps, sends and recvs from its
        doorbell; without it (and not required) they go over the socket."""
        reason = doorbell.unavailable()
        if env.transport != "shm":
            reason = "the fast path needs the session's shared memory (transport 'shm')"
        if reason is None:
            try:
                reply = self._request({"type": "fast", "session": env.session})
            except (InvalidArgumentError, LimitExceededError, ProtocolError) as exc:
                reason = str(exc)  # an older daemon does not know "fast": ProtocolError
            else:
                env._enable_fast_path(reply)
                return
        if required:
            raise InvalidArgumentError(f"fast_path=True: {reason}")

    def list_envs(self) -> list[str]:
        """Ids of every env the daemon can make, sorted."""
        return [env["id"] for env in self.describe_envs()]

    def describe_envs(self) -> list[dict[str, Any]]:
        """Every env the daemon can make, with its spaces, time limit and parameters."""
        return self._request({"type": "list_envs"})["envs"]

    def status(self) -> dict[str, Any]:
        """The daemon's state: version, pid, threads, clients, sessions, envs, limits."""
        reply = self._request({"type": "status"})
        return {k: v for k, v in reply.items() if k not in ("id", "ok")}

    def _close_session(self, session: str) -> None:
        """Free a session in the daemon; a daemon that is gone has freed it already."""
        try:
            self._request({"type": "close", "session": session})
        except (ConnectionLostError, EnvdTimeoutError, EnvStateError, UnknownSessionError):
            pass

    def close(self) -> None:
        """Close every env made through this client, then the connection (one
        ``bye`` frees all its sessions in the daemon).  Idempotent, and a
        no-op while it runs (an env that owns this client closes it back)."""
        if self.closed or self._closing:
            return
        self._closing = True
        try:
            for env in list(self._envs):
                env.close()
            if not self._lost:
                self._request({"type": "bye"}, timeout=min(self.timeout, 5.0))
        except EnvdError:
            pass  # the daemon is gone, stuck or confused: the lease frees the sessions
        finally:
            with self._lock:
                self._teardown()

    def _teardown(self) -> None:
        self.closed = True
        self._release()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"connected to {self.server_info.get('server')}"
        return f"envd.Client({self.endpoint!r}, {state})"


def _check_default_folder(endpoint: str, folder: str) -> None:
    """Refuse envd's default socket folder ($XDG_RUNTIME_DIR, else
    /tmp/envd-$UID) when another user owns it or may write it: in /tmp anyone
    could have created it first and put their daemon's socket in it, to read
    our observations and feed us theirs.  Other folders (an explicit ipc://
    endpoint or ENVD_ENDPOINT, e.g. a volume shared with a container) are the
    caller's choice and not checked, as the daemon does (server/daemon.py)."""
    builtin = protocol.default_endpoint({**os.environ, "ENVD_ENDPOINT": ""})
    if os.path.normpath(folder) != os.path.normpath(os.path.dirname(builtin[len("ipc://"):])):
        return
    try:
        info = os.lstat(folder)
    except FileNotFoundError:
        return  # no daemon there: the probe says so
    why = ownership.untrusted_reason(info, is_dir=True)
    if why is not None:
        raise UntrustedPathError(
            f"refusing to connect to {endpoint}: envd's default socket folder {folder} is not "
            f"safe: {why}. Another user may have created it to serve you their daemon. Check "
            f"it with `ls -ld {folder}`; if it is not yours, remove it (the daemon creates it "
            "with mode 0700) or connect to an explicit endpoint")


def connect(endpoint: str | None = None, *, timeout: float = 30.0,
            server_key: str | bytes | os.PathLike | None = None,
            client_key: str | os.PathLike | None = None) -> Client:
    """Connect to the envd daemon at endpoint ("ipc:///path" or "tcp://host:port";
    default: ENVD_ENDPOINT, else the default ipc socket).  Every call on the
    client and its envs raises envd.EnvdTimeoutError after timeout seconds
    without a reply, and envd.ConnectionLostError at once if the daemon goes away.

    A daemon with CURVE keys (SECURITY.md) admits tcp clients that give both
    server_key, the daemon's public ``.key`` file or its 40-character Z85
    text, and client_key, this client's ``.key_secret`` file whose ``.key``
    is in the daemon's --curve-allowed-clients directory (defaults:
    ENVD_SERVER_KEY, ENVD_CLIENT_KEY).  Keys are ignored for ipc endpoints.
    A rejected handshake raises envd.AuthenticationError at once."""
    return Client(endpoint, timeout=timeout, server_key=server_key, client_key=client_key)

