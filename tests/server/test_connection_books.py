"""The books of server/connections.py without a daemon: the fd budget, the
connection cap, the hello timeout and the binding of routing ids."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from envd.server import connections
from envd.server.connections import Connections


def test_the_budget_follows_the_open_file_limit():
    assert connections.fd_reserve(200) == 128 and connections.fd_reserve(20000) == 5000
    assert connections.default_max_connections(1024) == (1024 - 256) // 2
    assert connections.default_max_connections(100) == 1  # never zero


def test_the_soft_limit_is_raised_to_the_hard_limit():
    code = ("import resource; from envd.server.connections import raise_fd_limit; "
            "print(raise_fd_limit(), *resource.getrlimit(resource.RLIMIT_NOFILE))")
    done = subprocess.run(["prlimit", "--nofile=100:250", sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=120, cwd="/")
    assert done.stdout.split() == ["250", "250", "250"], done.stderr


def pair() -> tuple[socket.socket, socket.socket]:
    ours, theirs = socket.socketpair()
    theirs.settimeout(10)
    return ours, theirs


def test_a_connection_over_the_cap_is_shut_down_not_closed():
    books = Connections(max_connections=2, hello_timeout=60)
    sockets = [pair() for _ in range(3)]
    try:
        for ours, _ in sockets:
            books.accepted(ours.fileno())
        assert books.live == 2 and books.refused == 1
        ours, theirs = sockets[2]
        assert theirs.recv(1) == b""       # the peer sees the hang-up...
        assert ours.fileno() >= 0          # ...and the fd is still open (libzmq's to close)
        assert not books.message(ours.fileno(), b"\x01shed")  # a shed peer makes no client
        assert sockets[0][0].send(b"x") == 1  # the others are untouched
        books.disconnected(sockets[0][0].fileno())
        assert books.live == 1 and books.free_slots() == 0  # the shed one still holds its fd
        books.disconnected(ours.fileno())
        assert books.free_slots() == 1
    finally:
        for ours, theirs in sockets:
            ours.close()
            theirs.close()


def test_a_client_that_said_hello_before_its_accept_was_reported_is_kept():
    """The monitor reports accepts asynchronously: a client's hello can come
    first.  At the cap, the connection shed is one that has said nothing."""
    books = Connections(max_connections=1, hello_timeout=60)
    silent, client = pair(), pair()
    try:
        books.accepted(silent[0].fileno())
        books.admit(client[0].fileno())       # its hello, before its ACCEPTED
        books.accepted(client[0].fileno())
        assert books.live == 1 and books.refused == 1
        assert silent[1].recv(1) == b""       # the silent one was hung up on
        assert books.admitted(client[0].fileno())
        assert client[0].send(b"x") == 1      # the client's connection is untouched
    finally:
        for ours, theirs in (silent, client):
            ours.close()
            theirs.close()


def test_a_connection_that_says_no_hello_is_reaped():
    books = Connections(max_connections=10, hello_timeout=0.1)
    (quiet, quiet_peer), (greeted, greeted_peer) = pair(), pair()
    try:
        books.accepted(quiet.fileno())
        books.accepted(greeted.fileno())
        books.admit(greeted.fileno())
        time.sleep(0.2)
        books.reap()
        assert quiet_peer.recv(1) == b"" and books.reaped == 1
        greeted_peer.settimeout(0.2)
        try:
            greeted_peer.recv(1)
            raise AssertionError("the greeted connection was shut down")
        except TimeoutError:
            pass
    finally:
        for sock in (quiet, quiet_peer, greeted, greeted_peer):
            sock.close()


def test_a_routing_id_mismatch_is_counted_never_dropped():
    """The books bind a routing id to its connection, but a mismatch (late
    monitor events on reused fd numbers make the books wrong at times) only
    counts; only a connection being shed loses its messages."""
    books = Connections(max_connections=1, hello_timeout=60)
    books.accepted(7)
    assert books.message(7, b"\x01owner")
    assert books.message(8, b"\x01owner") and books.mismatched == 1
    books.disconnected(7)
    assert books.message(9, b"\x01owner") and books.mismatched == 2
    books.accepted(7)
    books.accepted(8)                                # over the cap: shed
    assert not books.message(8, b"\x01other")       # a shed connection makes no client
    assert books.message(-1, b"\x01unknown")        # no fd known: nothing to bind


def test_a_make_that_would_eat_into_the_reserve_is_refused(monkeypatch):
    """Daemon._check_fds: the fds in use, plus one per make in flight, plus
    the free connection slots, must leave the reserve free."""
    import pytest

    from envd.errors import LimitExceededError
    from envd.server import daemon as daemon_module
    from envd.server.config import Config

    daemon = daemon_module.Daemon(Config(threads=0))
    daemon.fd_limit, daemon._fd_reserve = 200, 128
    daemon.connections = Connections(max_connections=8, hello_timeout=60)
    monkeypatch.setattr(daemon_module, "open_fds", lambda: 200 - 128 - 8 - 1)
    daemon._check_fds(0)  # exactly one fd left for this make
    with pytest.raises(LimitExceededError, match="short of file descriptors") as caught:
        daemon._check_fds(1)  # another make in flight takes it
    assert "--max-connections" in str(caught.value) and "ulimit -n" in str(caught.value)


def test_a_hosted_make_counts_its_memfd_and_a_pidfd_per_worker(monkeypatch):
    """A hosted make of W workers needs its segment's fd, its private memfd,
    a worker's start pipe and W pidfds (kept by the session); the hosted
    makes in flight count theirs too."""
    import pytest

    from envd.errors import LimitExceededError
    from envd.server import daemon as daemon_module
    from envd.server.config import Config

    daemon = daemon_module.Daemon(Config(threads=0))
    daemon.fd_limit, daemon._fd_reserve = 200, 128
    daemon.connections = Connections(max_connections=8, hello_timeout=60)
    monkeypatch.setattr(daemon_module, "open_fds", lambda: 200 - 128 - 8 - 6)
    daemon._check_fds(0, 0, 3)  # 1 + 2 + 3: exactly what is left
    with pytest.raises(LimitExceededError, match="short of file descriptors"):
        daemon._check_fds(0, 0, 4)
    with pytest.raises(LimitExceededError, match="short of file descriptors"):
        daemon._check_fds(0, 1, 1)  # a hosted make in flight holds 1 + 2 + 1 (at most)
    daemon._check_fds(1, 0, 0)  # a native make: one fd


def test_an_admitted_client_on_a_reused_fd_is_never_reaped():
    """Issue 38 (the short-lived client lost mid-make in test_many_clients):
    connection X on fd n closes before the monitor reports its accept, and
    client A gets the same fd number.  X's late ACCEPTED then reads A's
    socket inode, A's hello admits that peer, and X's DISCONNECTED removed
    it with the admission; A's own ACCEPTED came in unadmitted, and a client
    silent on its request socket past --hello-timeout (waiting for a long
    make; its heartbeats use another connection) was shut down mid-make."""
    books = Connections(max_connections=8, hello_timeout=0.05)
    x, x_peer = pair()
    a, a_peer = pair()
    fd = x.fileno()
    try:
        x.detach()  # X is gone; A's socket takes its fd number, as libzmq's accept would
        os.close(fd)
        os.dup2(a.fileno(), fd)
        books.accepted(fd)                      # X's ACCEPTED, reported late
        assert books.message(fd, b"\x01client-A")  # A's hello...
        assert not books.admitted(fd)
        books.admit(fd)                         # ...admits it
        books.disconnected(fd)                  # X's DISCONNECTED
        books.accepted(fd)                      # A's ACCEPTED
        time.sleep(0.1)                         # past --hello-timeout, A silent (a long make)
        books.reap()
        assert books.reaped == 0 and books.admitted(fd)
        a_peer.settimeout(0.05)
        try:
            assert a_peer.recv(1) != b""        # no hang-up
        except TimeoutError:
            pass                                # (nothing: the connection is alive)
    finally:
        os.close(fd)
        for sock in (x_peer, a, a_peer):
            sock.close()
