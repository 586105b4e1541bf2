"""File descriptors and connections (issue 15, defect 5, and session binding):
the daemon raises its open-file limit, holds at most --max-connections
connections, drops those that say no hello within --hello-timeout, refuses a
make short of fds, never aborts when peers flood it, and binds sessions to
the connection that made them.

The daemons here run under a low RLIMIT_NOFILE (prlimit) so that a few
hundred connections are a flood; the cap and timeouts are given as ENVD_*
variables, which an older daemon ignores (so these tests fail on it for the
defect, not for an unknown flag)."""
from __future__ import annotations

import os
import socket
import threading
import time

import msgpack
import numpy as np
import zmq
import zmq.auth
from support.daemon import DEADLINE, Bystander, DaemonProcess, TwinStepper, wait_until
from test_curve import free_port, keys  # noqa: F401 -- keys is a fixture
from zmq.utils.monitor import recv_monitor_message

import envd
from envd import protocol

#: The open-file limit of the flooded daemons, and how many connections flood them.
FD_LIMIT = 400
FLOOD = 600


def limited_daemon(harness, name: str, *args: str, fd_limit: int = FD_LIMIT,
                   env: dict[str, str] | None = None) -> DaemonProcess:
    """A daemon whose soft and hard open-file limits are fd_limit."""
    daemon = DaemonProcess(harness.tmp_path / name, "--threads", "2", "--lease-timeout", "10",
                           *args, env=env, prefix=("prlimit", f"--nofile={fd_limit}:{fd_limit}"))
    harness.daemons.append(daemon)
    return daemon


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class FdWatch(threading.Thread):
    """Samples a process's fd count until stopped; remembers the highest."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.highest, self.halt = pid, 0, threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                self.highest = max(self.highest, fd_count(self.pid))
            except OSError:
                return
            time.sleep(0.005)

    def stop(self) -> int:
        self.halt.set()
        self.join(DEADLINE)
        return self.highest


def flood(family: int, address, count: int) -> list[socket.socket]:
    """count raw connections to address that never speak ZMTP (those the
    daemon refuses may fail to connect: that is fine)."""
    held = []
    for _ in range(count):
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(5.0)
        try:
            sock.connect(address)
        except OSError:
            sock.close()
            continue
        held.append(sock)
    return held


def connect_when_admitted(endpoint: str, **curve_keys) -> envd.Client:
    """Connect as a user would to a daemon at its connection cap: a refused
    connection raises ConnectionLostError naming the cap; try again."""
    end = time.monotonic() + DEADLINE
    while True:
        try:
            return envd.connect(endpoint, timeout=DEADLINE, **curve_keys)
        except envd.ConnectionLostError as exc:
            assert "--max-connections" in str(exc), exc
            assert time.monotonic() < end, "never admitted"
            time.sleep(0.2)


def test_the_open_file_limit_is_raised_to_the_hard_limit(harness):
    daemon = DaemonProcess(harness.tmp_path / "d", "--threads", "1",
                           prefix=("prlimit", "--nofile=150:300"))
    harness.daemons.append(daemon)
    with open(f"/proc/{daemon.pid}/limits") as f:
        row = next(line for line in f if line.startswith("Max open files"))
    assert row.split()[3:5] == ["300", "300"], row
    assert "open-file limit 300" in daemon.log()
    assert "at most 86 connections" in daemon.log()  # (300 - 128) // 2


def test_a_flood_of_idle_ipc_connections_is_capped_and_never_aborts(harness):
    """1100 idle ipc connections made libzmq abort the daemon (EMFILE in its
    ipc accept asserts); here FLOOD connections against a limit of FD_LIMIT,
    sent as fast as this process can connect."""
    daemon = limited_daemon(harness, "ipc", env={"ENVD_MAX_CONNECTIONS": "24"})
    bystander = Bystander(daemon)
    watch = FdWatch(daemon.pid)
    watch.start()
    held = flood(socket.AF_UNIX, daemon.endpoint[len("ipc://"):], FLOOD)
    try:
        bystander.check()
        wait_until(lambda: "refused a connection" in daemon.log(), what="the cap's log line")
        assert fd_count(daemon.pid) < FD_LIMIT
    finally:
        for sock in held:
            sock.close()
        highest = watch.stop()
        bystander.close()
    assert daemon.proc.poll() is None, daemon.log()
    assert highest < FD_LIMIT, highest
    # the flood is gone: a new client gets in and steps
    client = harness.connect(daemon)
    with client.make("CartPole-v1", 2, seed=1) as env:
        env.reset()
        env.step(np.array([0, 1]))


def test_raw_tcp_connections_without_keys_leave_curve_clients_served(harness, keys):  # noqa: F811
    """Raw tcp connections made a CURVE daemon spin on EMFILE and refuse
    its listed clients.  A listed client steps through the flood, and one
    that connects after it gets in once the silent peers are dropped."""
    port = free_port()
    # 200: the flood exhausts an older daemon's fds (libzmq's tcp accept
    # tolerates EMFILE, so bursts past the reserve cost this one nothing)
    daemon = limited_daemon(harness, "curve", "--bind", f"tcp://127.0.0.1:{port}", *keys.flags,
                            fd_limit=200,
                            env={"ENVD_MAX_CONNECTIONS": "16", "ENVD_HELLO_TIMEOUT": "2"})
    endpoint = f"tcp://127.0.0.1:{port}"
    listed = envd.connect(endpoint, timeout=DEADLINE, server_key=keys.server,
                          client_key=keys.client)
    harness.clients.append(listed)
    stepper = TwinStepper(listed, "CartPole-v1", 4, seed=5)
    stepper.start()
    held = flood(socket.AF_INET, ("127.0.0.1", port), FLOOD)
    try:
        wait_until(lambda: stepper.steps > 50 or stepper.error is not None,
                   what="the listed client to step through the flood")
        started = time.monotonic()
        late = connect_when_admitted(endpoint, server_key=keys.server, client_key=keys.client)
        harness.clients.append(late)
        with late.make("CartPole-v1", 2, seed=2) as env:
            env.reset()
            env.step(np.array([1, 0]))
        # libzmq alone drops a silent peer after 30 s (its handshake interval)
        assert time.monotonic() - started < 20, "the listed client waited for the flood"
    finally:
        for sock in held:
            sock.close()
        stepper.finish()
    assert daemon.proc.poll() is None, daemon.log()


def test_a_connection_that_says_no_hello_is_dropped(harness):
    daemon = limited_daemon(harness, "quiet", env={"ENVD_HELLO_TIMEOUT": "1"})
    bystander = Bystander(daemon)
    context = zmq.Context()
    quiet = context.socket(zmq.DEALER)
    monitor = quiet.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED)
    try:
        quiet.setsockopt(zmq.LINGER, 0)
        quiet.setsockopt(zmq.RECONNECT_IVL, 60_000)  # one connection, not a retry loop
        quiet.connect(daemon.endpoint)
        events = []
        end = time.monotonic() + DEADLINE
        while zmq.EVENT_DISCONNECTED not in events and time.monotonic() < end:
            if monitor.poll(100):
                events.append(recv_monitor_message(monitor)["event"])
        assert events[:1] == [zmq.EVENT_HANDSHAKE_SUCCEEDED], events
        assert zmq.EVENT_DISCONNECTED in events, "the silent connection was never dropped"
        # The daemon dropped it, not libzmq (whose handshake interval ended
        # with the handshake): its log says so, whatever the time it took.
        wait_until(lambda: "said no hello" in daemon.log(), what="the reaping's log line")
        time.sleep(1.5)  # past the timeout: the bystander said hello and stays
        bystander.check()
        # only the silent one: not the bystander's request or heartbeat connection
        assert daemon.log().count("said no hello") == 1, daemon.log()
    finally:
        quiet.disable_monitor()
        monitor.close(0)
        quiet.close(0)
        context.term()
        bystander.close()


def test_sessions_hold_no_fds(harness):
    """Under an open-file limit of 200, 200 sessions (sync, async, fast path)
    fit: a made session holds no fd, so makes never run the daemon out of
    them (the check at make, tested in tests/server/test_connection_books.py,
    guards the one fd a make needs while it creates its segment)."""
    daemon = limited_daemon(harness, "fds", "--fast-path-sessions", "100", fd_limit=200,
                            env={"ENVD_MAX_CONNECTIONS": "8"})
    client = harness.connect(daemon)
    before = fd_count(daemon.pid)
    envs = []
    for k in range(200):
        kind = k % 3
        envs.append(client.make("CartPole-v1", 2, seed=k, fast_path=kind == 2,
                                batch_size=1 if kind == 1 else None))
    assert fd_count(daemon.pid) <= before + 2, (before, fd_count(daemon.pid))
    for k, env in enumerate(envs):
        if k % 3 == 1:
            env.async_reset()
            assert len(env.recv()[4]["env_id"]) == 1
        else:
            env.reset()
        env.close()


def raw_dealer(context: zmq.Context, endpoint: str, routing_id: bytes) -> zmq.Socket:
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.ROUTING_ID, routing_id)
    sock.connect(endpoint)
    return sock


def ask(sock: zmq.Socket, header: dict, timeout: float = DEADLINE) -> dict | None:
    sock.send(protocol.pack(header))
    if not sock.poll(timeout * 1000):
        return None
    return msgpack.unpackb(sock.recv_multipart()[0], raw=False)


def test_a_second_peer_claiming_a_routing_id_cannot_touch_its_sessions(harness):
    """While a client is connected, libzmq's ROUTER reads nothing of a second
    peer claiming its routing id; after it is gone, its routing id (128 random
    bits only it knew) is what keeps its sessions (SECURITY.md)."""
    daemon = harness.daemon("--threads", "1", "--lease-timeout", "30")
    watcher = harness.connect(daemon)
    context = zmq.Context()
    routing_id = b"\x01" + os.urandom(15)
    owner = raw_dealer(context, daemon.endpoint, routing_id)
    thief = None
    try:
        assert ask(owner, {"type": "hello", "id": 1, "version": protocol.PROTOCOL_VERSION})["ok"]
        session = ask(owner, {"type": "make", "id": 2, "env_id": "CartPole-v1",
                              "num_envs": 2})["session"]
        thief = raw_dealer(context, daemon.endpoint, routing_id)
        assert ask(thief, {"type": "close", "id": 3, "session": session}, timeout=3) is None
        assert ask(owner, {"type": "reset", "id": 4, "session": session})["ok"]
        assert watcher.status()["sessions"] == 1
        # a peer with another routing id names the session in vain
        other = raw_dealer(context, daemon.endpoint, b"\x01" + os.urandom(15))
        try:
            assert ask(other, {"type": "hello", "id": 1,
                               "version": protocol.PROTOCOL_VERSION})["ok"]
            reply = ask(other, {"type": "close", "id": 2, "session": session})
            assert reply["code"] == "unknown_session", reply
        finally:
            other.close(0)
        assert watcher.status()["sessions"] == 1
    finally:
        for sock in (owner, thief):
            if sock is not None:
                sock.close(0)
        context.term()
