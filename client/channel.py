"""One connection to a daemon and the encoding of what travels on it.

A Channel is the client's Session (in jupyter_client's sense): it owns the
DEALER socket (a random routing id: the identity the daemon leases sessions
to), the socket monitor that reports a broken connection or a failed CURVE
handshake at once, the heartbeat thread (heartbeat.py), and everything about
the wire that callers should not repeat: packing and unpacking, request ids,
the acks of large replies' tokens, the size limit, and the routing of replies
nobody waits for.  Callers (Client, the transports) see three calls:

  - ``request(header, blobs)``: send, wait for the reply with the same id (at
    most ``timeout`` seconds), return it or raise its error;
  - ``post(header, blobs, on_reply)``: send without waiting; ``on_reply`` runs
    when the reply is read (at the latest while a later request waits: the
    daemon reads a connection's requests in order and answers a send at once),
    unless ``wait_posted`` waits for that reply and takes it itself;
  - ``read_late_replies()``: read what arrived for requests nobody waits for.

A Channel may be shared by threads; requests are serialised.

Unread replies (docs/protocol.md): every request acknowledges ("ack") the
token of the last large reply read, so the daemon's books of unread replies
stay empty, and posted requests are flow-controlled: at most
protocol.POSTED_WINDOW of them wait for their replies; the next one first
reads replies until there is room.
"""
from __future__ import annotations

import collections
import itertools
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from envd import protocol
from envd.client import security
from envd.client.heartbeat import Heartbeat
from envd.errors import ConnectionLostError, EnvdTimeoutError, EnvStateError, LimitExceededError

#: What runs when a reply nobody waits for is read (with the reply).
OnReply = Callable[[dict[str, Any]], None]
#: longest wait of check_alive for the lock a request on another thread holds
_LOCK_BACKOFF_S = 0.02
#: past its deadline, a wait still reads what came by then (a reply that is
#: in is never timed out: a caller waiting for several daemons in turn may
#: get to the last one at its deadline), up to this many messages (the
#: replies that may be queued before it), so a daemon that keeps sending
#: cannot hold the wait past its deadline
_READS_PAST_DEADLINE = protocol.POSTED_WINDOW + 2


class _Resources:
    """The sockets and the heartbeat thread of a Channel, released once by
    Channel.close, or by a finalizer when a Channel is garbage-collected
    unclosed (then the daemon frees its sessions when the lease runs out)."""

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


class Channel:
    """A DEALER connection to the daemon at endpoint (connected at once;
    nothing is sent until the first request, which must be ``hello``)."""

    def __init__(self, endpoint: str, timeout: float, curve: Mapping[int, bytes]):
        self.endpoint = endpoint
        self.timeout = timeout
        self.closed = False
        #: the daemon's --max-message-bytes, once hello said it: a larger
        #: request is refused here (the daemon would drop the connection)
        self.max_message_bytes: int | None = None
        self._curve = dict(curve)
        self._lost = False  # the connection broke: the daemon and its sessions are gone
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._ack: int | None = None  # token of the last large reply read
        # requests whose replies nobody waits for (timed out, posted): id -> on reply
        self._awaited: dict[int, OnReply | None] = {}
        self._posted: set[int] = set()  # ids of posted requests whose replies are unread
        #: the reply wait_posted read, until it returned it (an interrupt
        #: in between hands it to its on_reply)
        self._taken: dict[str, Any] | None = None
        # requests queued by threads that must not touch the socket (a
        # finalizer); sent before the next request, their replies read as late ones
        self._later: collections.deque[dict[str, Any]] = collections.deque()
        context = zmq.Context()
        self._socket = context.socket(zmq.DEALER)
        #: the routing id the daemon leases sessions to (ZeroMQ reserves ids starting with 0)
        self.identity = b"\x01" + os.urandom(15)
        self._socket.setsockopt(zmq.ROUTING_ID, self.identity)
        self._socket.setsockopt(zmq.LINGER, 0)
        # IPV6: tcp endpoints may name IPv6 addresses (dns+tcp:// resolves AAAA
        # records too); IPv4 addresses work as before.
        self._socket_options: dict[int, int | bytes] = {zmq.IPV6: 1, **self._curve}
        for option, value in self._socket_options.items():
            self._socket.setsockopt(option, value)
        self._monitor = self._socket.get_monitor_socket(security.MONITOR_EVENTS)
        self._resources = _Resources(context, self._socket, self._monitor)
        self._release = weakref.finalize(self, self._resources.release)
        # zmq_poll's items (what a zmq.Poller holds, without its Python layer):
        # the socket and its monitor (a wait), the monitor alone (_read_monitor's check)
        self._wait_pollin = [(self._socket, zmq.POLLIN), (self._monitor, zmq.POLLIN)]
        self._monitor_pollin = [(self._monitor, zmq.POLLIN)]
        try:
            self._socket.connect(endpoint)
        except BaseException:
            self.close()
            raise

    # ---- the three calls -------------------------------------------------------------
    def request(self, header: dict[str, Any], blobs: Sequence[Any] = (), *,
                timeout: float | None = None, late: OnReply | None = None) -> dict[str, Any]:
        """Send one request (header gets its "id") and return its ok reply;
        raise the error of an error reply, EnvdTimeoutError, or
        ConnectionLostError.  late(reply) runs when the reply of a request
        that timed out is read after all."""
        with self._lock:
            request_id = self._send(header, blobs)
            try:
                return self._wait_reply(request_id, header["type"],
                                        self.timeout if timeout is None else timeout)
            except EnvdTimeoutError:
                self._awaited[request_id] = late
                raise

    def post(self, header: dict[str, Any], blobs: Sequence[Any], on_reply: OnReply) -> int:
        """Send one request without waiting for its reply (its id): on_reply(reply)
        runs when the reply is read.  Waits (at most timeout) while
        POSTED_WINDOW posted requests wait for theirs."""
        with self._lock:
            if len(self._posted) >= protocol.POSTED_WINDOW:  # (the hot path: room)
                self._make_room(header["type"])
            request_id = self._send(header, blobs)
            self._awaited[request_id] = on_reply
            self._posted.add(request_id)
            return request_id

    def wait_posted(self, request_id: int, kind: str,
                    deadline: float | None = None) -> dict[str, Any] | None:
        """Wait (at most timeout, and not past deadline, time.monotonic()
        seconds, if given) for the reply of the posted request request_id,
        as ``request`` waits, and return it, ok or not: its on_reply does
        not run.  None if it was read already (on_reply ran).  Raises
        EnvdTimeoutError (on_reply runs when the reply comes after all) or
        ConnectionLostError."""
        with self._lock:  # (a thread holding it reads our reply meanwhile: on_reply)
            if request_id not in self._awaited:
                return None
            on_reply = self._awaited[request_id]
            try:
                return self._wait_reply(request_id, kind, self.timeout, raise_errors=False,
                                        deadline=deadline, posted=True)
            except BaseException:
                # an interrupt (Ctrl-C) once the reply was read: on_reply
                # takes it in, as a late one (it can come no other way)
                taken, self._taken = self._taken, None
                if taken is not None and on_reply is not None:
                    on_reply(taken)
                raise
            finally:
                self._taken = None

    def awaits(self, request_id: int) -> bool:
        """The reply of request request_id (posted, or timed out) was not
        read yet: it may still come.  Under the lock: a reader on another
        thread takes a reply off the books and hands it to its callback in
        one holding of it, so a caller that asks this first, then looks for
        the reply where its callback puts it, misses no reply."""
        with self._lock:
            return request_id in self._awaited

    def read_late_replies(self, wait: float = 0.0) -> None:
        """Handle the replies that arrived for requests nobody waits for
        (timed out, or posted); wait up to `wait` seconds for the first."""
        with self._lock:
            timeout_ms = wait * 1000
            while not self.closed and self._socket.poll(int(timeout_ms)):  # (as pyzmq would)
                self._late_reply(self._recv_reply())
                timeout_ms = 0

    def post_later(self, header: dict[str, Any]) -> None:
        """Queue a request to send before the next one, its reply read as a
        late one.  Touches no socket: safe from any thread, even one inside
        a request on this channel (a garbage collector's finalizer)."""
        self._later.append(header)

    # ---- state --------------------------------------------------------------------------
    @property
    def lost(self) -> bool:
        """The connection broke: the daemon and its sessions are gone."""
        return self._lost

    @property
    def busy(self) -> bool:
        """A request waits for its reply (on some thread) now."""
        return self._lock.locked()

    @property
    def unanswered(self) -> int:
        """Requests whose replies nobody waits for and were not read yet
        (posted ones, and ones that timed out)."""
        return len(self._awaited)

    def pollables(self) -> tuple[zmq.Socket, zmq.Socket]:
        """The DEALER socket and its monitor, for a caller that waits on
        several channels at once with one zmq.Poller (async mode over several
        daemons, client/multi_async.py).  It never reads them itself: once
        the socket is readable it calls read_late_replies(), once the monitor
        is, check_alive()."""
        return self._socket, self._monitor

    def check_alive(self, waiting_for: str = "a fast-path request") -> None:
        """Raise ConnectionLostError if the monitor reported the daemon gone
        (for callers that wait elsewhere: the doorbell, a poller over several
        channels).  A request in progress on another thread reads the
        monitor itself: while one holds the lock this waits up to
        _LOCK_BACKOFF_S for it, so that a caller polling the monitor sleeps
        instead of finding the event unread again at once."""
        if not self._lost and self._lock.acquire(timeout=_LOCK_BACKOFF_S):
            try:
                if not self.closed:
                    self._read_monitor()
            finally:
                self._lock.release()
        if self._lost:
            raise ConnectionLostError(
                f"lost the connection to the daemon at {self.endpoint} while waiting for "
                f"{waiting_for}; the daemon stopped or crashed, and its sessions are gone")

    def start_heartbeat(self, interval: float) -> None:
        """Keep this connection's lease alive from a thread of its own."""
        self._resources.heartbeat = Heartbeat(self._resources.context, self.endpoint,
                                              self.identity, interval,
                                              socket_options=self._socket_options)
        self._resources.heartbeat.start()

    def stop_heartbeat(self) -> None:
        """Stop renewing the lease (the daemon frees the sessions after it)."""
        self._resources.stop_heartbeat()

    def close(self) -> None:
        """Release the sockets and the heartbeat thread.  Idempotent."""
        with self._lock:
            self.closed = True
            self._release()

    # ---- the wire -----------------------------------------------------------------------
    def _send(self, header: dict[str, Any], blobs: Sequence[Any]) -> int:
        """Put one request on the socket (lock held); its id."""
        if self.closed:
            raise EnvStateError(f"this client of {self.endpoint} is closed")
        # (the hot path is one branch each: nothing reported, nothing
        # queued, no blobs; a call a branch would skip is not made)
        if zmq.zmq_poll(self._monitor_pollin, 0):
            self._read_monitor()
        if self._lost and header["type"] == "hello":
            raise self._closed_before_hello()
        if self._lost:
            raise ConnectionLostError(
                f"the connection to the daemon at {self.endpoint} was lost and its sessions "
                "with it; connect again")
        if self._later:
            self._send_later()
        request_id = header["id"] = next(self._ids)
        if self._ack is not None:
            header["ack"] = self._ack
        packed = protocol.pack(header)
        limit = self.max_message_bytes
        if blobs:
            size = len(packed) + sum(map(len, blobs))
            if limit is not None and size > limit:
                raise self._too_large(size, header["type"])
            self._socket.send_multipart([packed, *blobs], copy=False)
            return request_id
        if limit is not None and len(packed) > limit:
            raise self._too_large(len(packed), header["type"])
        self._socket.send(packed)  # (one small frame, copied: cheaper than zero-copy here)
        return request_id

    def _send_later(self) -> None:
        """Send the requests post_later queued, as far as the window allows
        (lock held); their replies are read as late ones."""
        while self._later and len(self._posted) < protocol.POSTED_WINDOW:
            header = self._later.popleft()
            request_id = header["id"] = next(self._ids)
            if self._ack is not None:
                header["ack"] = self._ack
            self._socket.send(protocol.pack(header))
            self._awaited[request_id] = None
            self._posted.add(request_id)

    def _too_large(self, size: int, kind: str) -> LimitExceededError:
        """The refusal of what the daemon would drop the connection for."""
        return LimitExceededError(
            f"a {kind!r} message of {size} bytes is over the daemon's limit of "
            f"{self.max_message_bytes} (--max-message-bytes)")

    def _make_room(self, kind: str) -> None:
        """Read replies until fewer than POSTED_WINDOW posted requests wait
        for theirs (lock held): the daemon queues only so many replies for a
        client that does not read them, and drops it beyond."""
        deadline = time.monotonic() + self.timeout
        while len(self._posted) >= protocol.POSTED_WINDOW:
            self._read_monitor()
            remaining = deadline - time.monotonic()
            if self._socket.poll(int(max(0.0, min(remaining, 0.1)) * 1000)):  # (as pyzmq would)
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

    def _wait_reply(self, request_id: int, kind: str, timeout: float,
                    raise_errors: bool = True, deadline: float | None = None,
                    posted: bool = False) -> dict[str, Any]:
        """The reply to request_id, waited for at most timeout from now and
        not past deadline (time.monotonic() seconds) if given: a caller
        waiting for several daemons in turn gives each the same one, so
        that one timeout bounds its call.  What came by then is read even
        once deadline passed (a reply in is never timed out); the error
        names timeout, the Client's.  posted: request_id was posted (its
        reply, once read, is no longer awaited, and is kept in _taken until
        wait_posted returns it)."""
        start = time.monotonic()
        end = start + timeout
        if deadline is not None and deadline < end:
            end = deadline
        now: float | None = start
        reads_past = 0  # (messages read past end: _READS_PAST_DEADLINE at most)
        while True:
            remaining = end - (time.monotonic() if now is None else now)
            now = None  # (the first pass reads the clock once; every later one again)
            if remaining <= 0:
                reads_past += 1
            timeout_ms = int(remaining * 1000)  # (as pyzmq would)
            events = (dict(zmq.zmq_poll(self._wait_pollin, timeout_ms if timeout_ms > 0 else 0))
                      if reads_past <= _READS_PAST_DEADLINE else {})
            if not events:
                if remaining <= 0:
                    raise EnvdTimeoutError(
                        f"no reply to {kind!r} from the daemon at {self.endpoint} within "
                        f"{timeout:g} s (Client timeout): the daemon is stuck or overloaded, "
                        "or never got the request")
                continue
            if self._socket in events:
                # First: a daemon that answered and then exited (a drain) sends
                # the reply before the disconnect; both may be ready at once.
                reply = self._recv_reply(request_id if posted else None)
                if reply.get("id") != request_id:
                    self._late_reply(reply)
                    continue
                if reply.get("ok") or not raise_errors:
                    return reply
                protocol.raise_error(reply)
            event = recv_monitor_message(self._monitor) if self._monitor in events else None
            if event is not None and event["event"] == zmq.EVENT_DISCONNECTED:
                self._mark_lost()  # the lease goes with the sessions
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
                self._mark_lost()
                raise failure

    def _recv_reply(self, posted: int | None = None) -> dict[str, Any]:
        """One reply: its header, with its data frames (if any) under "_blobs"
        as memoryviews of the received frames (not copied: the inline
        transport's arrays can be large).  The reply of request posted (a
        posted one wait_posted waits for) is no longer awaited from here
        on, and kept in _taken (wait_posted's, should an interrupt come)."""
        # (each frame says whether more follow: Frame.more, read by recv; a
        # getsockopt(RCVMORE) per message would cost more than the recv)
        frame = self._socket.recv(copy=False)
        blobs = []
        more = frame.more
        while more:  # all of them, whatever the header holds
            part = self._socket.recv(copy=False)
            blobs.append(part.buffer)
            more = part.more
        reply = protocol.unpack_reply(frame.bytes)
        if isinstance(reply.get("token"), int):  # a large reply: acknowledged from now on
            self._ack = reply["token"]
        if reply.get("code") == "connection_lost":  # the daemon dropped this connection
            self._mark_lost()
        if blobs:
            reply["_blobs"] = blobs
        if posted is not None and reply.get("id") == posted:
            self._taken = reply
            del self._awaited[posted]
            self._posted.discard(posted)
        return reply

    def _late_reply(self, reply: dict[str, Any]) -> None:
        """A reply to a request nobody waits for: hand it to its callback."""
        request_id = reply.get("id")
        if not isinstance(request_id, int):  # (not an id this client sent, maybe unhashable)
            return
        self._posted.discard(request_id)
        callback = self._awaited.pop(request_id, None)
        if callback is not None:
            callback(reply)

    def _read_monitor(self) -> None:
        """Take in what the monitor reported since the last request (lock
        held): a disconnect means the daemon is gone (a new one at the same
        endpoint would otherwise get this request); a failed handshake raises."""
        while zmq.zmq_poll(self._monitor_pollin, 0):  # (Socket.poll, less its Poller)
            event = recv_monitor_message(self._monitor)
            if event["event"] == zmq.EVENT_DISCONNECTED:
                self._mark_lost()
                continue
            failure = self._handshake_error(event)
            if failure is not None:
                self._mark_lost()
                raise failure

    def _handshake_error(self, event: Mapping[str, Any]) -> Exception | None:
        return security.handshake_error(event, self.endpoint, self._curve, self.timeout)

    def _mark_lost(self) -> None:
        self._lost = True
        self._resources.stop_heartbeat()

    def _closed_before_hello(self) -> ConnectionLostError:
        """The daemon hung up before hello was answered: at its connection
        cap (it drops new connections at once), or stopping."""
        return ConnectionLostError(
            f"the daemon at {self.endpoint} closed the connection before it answered hello: "
            "it holds its maximum of connections (--max-connections) or is stopping; try "
            "again later")
