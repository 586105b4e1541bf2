"""The daemon's file-descriptor budget and its books of peer connections.

Why: every ZeroMQ connection the daemon accepts holds one file descriptor in
libzmq's I/O thread, and libzmq handles running out badly: its ipc listener
asserts (SIGABRT, every session lost) when accept() fails with EMFILE, and its
tcp listener retries the failing accept in a busy loop.  So the daemon never
lets libzmq get near the limit:

  - at startup the soft RLIMIT_NOFILE is raised to the hard limit;
  - ``fd_reserve(limit)`` fds are never used for connections or sessions: they
    cover the daemon's own fds (libzmq's mailboxes, the pool, logs, metrics,
    plugins) and a burst of connections accepted faster than the daemon sheds
    them;
  - at most ``--max-connections`` peer connections are kept (default: half of
    what the reserve leaves).  A socket monitor reports each accepted
    connection with its fd; one over the cap is shut down at once
    (shutdown(2), never close(2): the fd stays libzmq's, which sees the peer
    hang up, closes it and reports it disconnected);
  - a connection that has not said hello (or heartbeat for a connected client)
    within ``--hello-timeout`` seconds is shut down the same way;
  - a make is refused (limit_exceeded) when the fds left after the reserve and
    the unused connection slots cannot take one more session.

Sessions are leased to the routing id that said hello.  libzmq reads no
message of a second peer that claims a routing id in use, and the official
client's routing ids are 128 random bits nobody else learns.  Connections
also binds each routing id to its fd, but only counts a mismatch
(``mismatched``): the monitor reports accepts and closes late, so on a busy
daemon the books may pin an id to an fd number a newer connection has taken,
and dropping on that basis once lost a real client's requests.

Threads: the daemon's connection thread (envd-conn) feeds Connections the
monitor events as they come, so a connection over the cap is shed within
microseconds of its accept, not when the event loop next gets round to it;
the event loop thread feeds it the source fd of every message (ZMQ_SRCFD)
and reaps.  One lock guards the books; shut_down runs under it (a syscall).
"""
from __future__ import annotations

import logging
import os
import resource
import socket
import threading
import time
from dataclasses import dataclass, field

log = logging.getLogger("envd.server")

#: Fds one make holds while it is in flight: its segment's, between open and
#: mmap.  A made session holds none (the segment guard closes the fd once the
#: segment is mapped: measured, sync, async and fast-path sessions alike).
FDS_PER_MAKE = 1
#: What a hosted make (server/hosted.py) holds besides while in flight: its
#: private memfd (closed once the workers have it; its mapping holds no fd)
#: and one worker's start pipe at a time.  Each of its num_workers workers
#: adds a pidfd, which the session keeps until it is freed.
FDS_PER_HOSTED_MAKE = 2


def make_fds(num_workers: int = 0) -> int:
    """Fds one make needs: FDS_PER_MAKE, and for a hosted make (num_workers
    > 0) FDS_PER_HOSTED_MAKE plus a pidfd per worker."""
    return FDS_PER_MAKE + (FDS_PER_HOSTED_MAKE + num_workers if num_workers else 0)
#: The smallest reserve: the daemon's own fds with one client, measured, are
#: about 25; the rest absorbs a burst of connections before they are shed.
MIN_FD_RESERVE = 128


def raise_fd_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:  # the kernel caps it anyway: fs.nr_open
        try:
            with open("/proc/sys/fs/nr_open") as f:
                hard = int(f.read())
        except (OSError, ValueError):
            hard = 1 << 20
    if soft == resource.RLIM_INFINITY or soft >= hard:
        return soft if soft != resource.RLIM_INFINITY else hard
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        log.warning("could not raise the open-file limit from %d to %d: %s", soft, hard, exc)
        return soft
    return hard


def fd_reserve(limit: int) -> int:
    """Fds kept free of connections and sessions: a quarter of the limit, at
    least MIN_FD_RESERVE (fds not opened cost nothing; a burst of accepts
    that outruns the shedding on a loaded host must find them)."""
    return max(MIN_FD_RESERVE, limit // 4)


def default_max_connections(limit: int) -> int:
    """--max-connections when not given: half of what the reserve leaves (the
    other half is for sessions)."""
    return max(1, (limit - fd_reserve(limit)) // 2)


def open_fds() -> int:
    """How many fds this process holds now (0 without /proc: the check at
    make is then left to the connection cap and the reserve)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def shut_down(fd: int) -> None:
    """Make libzmq drop the connection on fd: shutdown(2) without closing the
    fd, which stays libzmq's (it sees the hang-up, closes it and reports
    DISCONNECTED).  An fd that is gone already (or reused by something that
    is not a socket) only raises OSError, which is ignored."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.detach()  # not ours to close


def _inode(fd: int) -> int:
    """The inode of the socket on fd (unique while it is open), -1 if none."""
    try:
        return os.fstat(fd).st_ino
    except OSError:
        return -1


@dataclass
class Peer:
    """One accepted connection."""

    fd: int
    accepted: float  # time.monotonic()
    inode: int       # the socket's inode when accepted: tells a reused fd number apart
    admitted: bool = False  # said hello, or heartbeat for a connected client
    shed: bool = False      # over the cap or past the hello timeout: being dropped
    identities: set[bytes] = field(default_factory=set)  # routing ids bound to it


class Connections:
    """Accepted connections by fd: the cap, the hello timeout, and which
    connection each routing id is bound to."""

    def __init__(self, max_connections: int, hello_timeout: float):
        self.max_connections = max_connections
        self.hello_timeout = hello_timeout
        self.peers: dict[int, Peer] = {}
        self._bound: dict[bytes, int] = {}   # routing id -> fd of its connection
        # routing ids whose connection closed -> its fd number (-1 once reused):
        # what that connection sent before it closed is still read and run
        self._orphaned: dict[bytes, int] = {}
        self._orphans_by_fd: dict[int, set[bytes]] = {}
        self.lock = threading.Lock()  # the connection thread and the event loop
        # fd -> socket inode of connections admitted before their ACCEPTED came in
        self._early: dict[int, int] = {}
        self.live = 0      # peers held and not being shed
        self.refused = 0   # connections shed over the cap (for the log)
        self.reaped = 0    # connections shed past the hello timeout
        self.mismatched = 0  # messages whose routing id the books bound to another fd

    def accepted(self, fd: int) -> None:
        """The monitor reported a new connection on fd: keep it, or shed it
        when the daemon holds --max-connections already."""
        with self.lock:
            self._disconnected(fd)  # a reused fd number: its old connection is gone
            for identity in self._orphans_by_fd.pop(fd, ()):
                if self._orphaned.get(identity) == fd:  # its leftovers: no longer told apart
                    self._orphaned[identity] = -1
            peer = self.peers[fd] = Peer(fd, time.monotonic(), _inode(fd))
            if self._early.pop(fd, None) == peer.inode != -1:
                peer.admitted = True
            self.live += 1
            if self.live <= self.max_connections:
                return
            # Over the cap.  A connection that said hello before its accept
            # was reported is a client already: shed one that has said
            # nothing instead (a flood's), which keeps the cap all the same.
            victim = peer
            if peer.admitted:
                victim = next((p for p in self.peers.values() if not p.admitted and not p.shed),
                              peer)
            self._shed(victim)
            self.refused += 1
            refused = self.refused
        if refused == 1 or refused % 1000 == 0:
            log.warning("refused a connection: the daemon holds its maximum of %d "
                        "(--max-connections); %d refused so far", self.max_connections,
                        refused, extra={"event": "connection_refused"})

    def disconnected(self, fd: int) -> None:
        """The monitor reported fd's connection closed: forget it, and orphan
        the routing ids bound to it."""
        with self.lock:
            self._disconnected(fd)

    def _disconnected(self, fd: int) -> None:
        peer = self.peers.pop(fd, None)
        if peer is None:
            return
        if not peer.shed:
            self.live -= 1
        # The books' peer read its inode late (its ACCEPTED came after its
        # connection closed and the fd number went to a newer one): the
        # socket that said hello is the one on fd now.  Its own ACCEPTED
        # is still to come: admitted then, not reaped for a hello it sent.
        if (peer.admitted and peer.inode != -1 and _inode(fd) == peer.inode
                and len(self._early) < 4096):
            self._early[fd] = peer.inode
        for identity in peer.identities:
            if self._bound.get(identity) == fd:
                del self._bound[identity]
                self._orphaned[identity] = fd
                self._orphans_by_fd.setdefault(fd, set()).add(identity)

    def message(self, fd: int, identity: bytes) -> bool:
        """A message of routing id identity came in on fd (-1: unknown): bind
        the id to fd's connection.  False (drop it) only when fd's connection
        is being shed."""
        with self.lock:
            return self._message(fd, identity)

    def _message(self, fd: int, identity: bytes) -> bool:
        # A routing id bound to another connection (or to one that closed) is
        # only logged, never dropped: the monitor reports accepts and closes
        # late, and by then a busy daemon's fd numbers may belong to newer
        # connections, so a mismatch can be the books' error rather than a
        # thief's.  What keeps sessions safe is the routing id itself: 128
        # random bits only its client knows, which libzmq's ROUTER refuses to
        # a second peer while the first is connected (SECURITY.md).
        orphaned_fd = self._orphaned.get(identity)
        if orphaned_fd is not None:
            if orphaned_fd != fd:
                self.mismatched += 1
            return True
        bound = self._bound.get(identity)
        if bound is not None:
            if bound != fd:
                self.mismatched += 1
            return True
        peer = self._current(fd)
        if peer is not None and peer.shed:
            return False  # being dropped: it makes no client
        if peer is not None:  # unknown fds (-1, or not reported yet) bind nothing
            self._bound[identity] = fd
            peer.identities.add(identity)
        return True

    def _current(self, fd: int) -> Peer | None:
        """The books' peer on fd, if it is the connection on fd now (lock
        held): a message may come in before the monitor events that say the
        fd's old connection closed and a new one took its number."""
        peer = self.peers.get(fd)
        if peer is not None and peer.inode != _inode(fd):
            return None
        return peer

    def admit(self, fd: int) -> None:
        """fd's peer said hello (or heartbeat for a connected client): it stays
        past the hello timeout.  An fd whose ACCEPTED has not come in yet is
        admitted when it does."""
        with self.lock:
            peer = self._current(fd)
            if peer is not None:
                peer.admitted = True
            elif fd >= 0 and len(self._early) < 4096:  # bounded: a stale entry only spares one peer
                self._early[fd] = _inode(fd)

    def admitted(self, fd: int) -> bool:
        """Whether the connection on fd is admitted (an unknown fd, -1, is)."""
        with self.lock:
            peer = self._current(fd)
            return fd < 0 or (peer is not None and peer.admitted)

    def reap(self) -> None:
        """Shed the connections that did not say hello within the timeout."""
        now = time.monotonic()
        with self.lock:
            late = [p for p in self.peers.values()
                    if not p.admitted and not p.shed and now - p.accepted > self.hello_timeout]
            for peer in late:
                self._shed(peer)
            self.reaped += len(late)
        for _ in late:
            log.info("dropped a connection that said no hello within %g s "
                     "(--hello-timeout)", self.hello_timeout,
                     extra={"event": "connection_reaped"})

    def _shed(self, peer: Peer) -> None:
        """Drop a connection (lock held); it stays in the books until libzmq
        reports it closed.  Only if its fd is still that connection's socket:
        libzmq may have closed it, and the number gone to a new connection,
        before the monitor's event says so."""
        peer.shed = True
        self.live -= 1
        if _inode(peer.fd) == peer.inode != -1:
            shut_down(peer.fd)

    def forget_orphans(self, clients) -> None:
        """Routing ids of closed connections whose client the daemon no longer
        holds (expired or gone) may be used again by a new connection."""
        with self.lock:
            self._orphaned = {i: fd for i, fd in self._orphaned.items() if i in clients}
            self._orphans_by_fd = {fd: kept for fd, ids in self._orphans_by_fd.items()
                                   if (kept := {i for i in ids if i in self._orphaned})}

    def free_slots(self) -> int:
        """Connection slots not in use: fds a make must leave for them."""
        with self.lock:
            return max(0, self.max_connections - len(self.peers))
