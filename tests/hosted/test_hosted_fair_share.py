"""Issue 38 N1: no client holds more than its share of the daemon's two
operation threads (makes, resets, renders).

A hog's makes of an env that hangs while it is made once held both threads:
a bystander's make and reset of four CartPoles took 0.005 s on an idle
daemon and 4.5-6.7 s behind the hog, or failed after 30 s.  Now each client
runs at most --max-ops-per-client (1) at once, the rest waits in its own
queue (at most --max-queued-ops, beyond it limit_exceeded at once), and the
queues are served round-robin.  Checked by events, not seconds: while the
hog's first make is still in flight (status says so, and no reply came), the
bystander's make and reset complete.
"""
from __future__ import annotations

import os

import msgpack
import zmq
from envs import DAEMON_ENV
from support.daemon import DEADLINE, wait_until

import envd
from envd import protocol

HANGING = "py:envd-test/HangingMake-v0"  # a make of two envs in one worker hangs


class Hog:
    """A raw connection that posts makes without waiting for their replies."""

    def __init__(self, endpoint: str):
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.ROUTING_ID, b"\x01" + os.urandom(15))
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(endpoint)
        self.ids = iter(range(1, 1 << 30))
        self.send({"type": "hello", "version": protocol.PROTOCOL_VERSION})
        assert self.recv()["ok"]

    def send(self, header: dict) -> int:
        header = {**header, "id": next(self.ids)}
        self.socket.send(protocol.pack(header))
        return header["id"]

    def make(self) -> int:
        return self.send({"type": "make", "env_id": HANGING, "num_envs": 2, "num_workers": 1})

    def recv(self, timeout: float = DEADLINE) -> dict:
        assert self.socket.poll(timeout * 1000), "no reply"
        return msgpack.unpackb(self.socket.recv(), raw=False)

    def close(self) -> None:
        self.socket.close()
        self.context.term()


def hog_row(status: dict, hog: Hog) -> dict:
    """The hog's row of status' operation table ({} while it has none)."""
    rows = [row for row in status["operations"]["clients"]
            if row["client"] == hog.socket.getsockopt(zmq.ROUTING_ID).hex()[:8]]
    return rows[0] if rows else {}


def test_a_hog_never_holds_every_operation_thread(harness):
    daemon = harness.daemon("--threads", "2", "--lease-timeout", "60", "--import", "daemon_envs",
                            "--python-env", HANGING[3:], "--hosted-timeout", "600",
                            "--max-queued-ops", "2", env=DAEMON_ENV)
    watcher = harness.connect(daemon, timeout=DEADLINE)
    hog = Hog(daemon.endpoint)
    try:
        first, second = hog.make(), hog.make()
        # both makes were taken in (each reserved its worker): one runs, one waits
        wait_until(lambda: watcher.status()["workers"] == 2, what="the hog's makes to start")
        wait_until(lambda: hog_row(watcher.status(), hog).get("running") == 1,
                   what="the hog's first make to run")
        assert hog_row(watcher.status(), hog)["queued"] == 1

        bystander = harness.connect(daemon, timeout=DEADLINE)
        with bystander.make("CartPole-v1", 4, seed=3) as env:
            local = envd.make("CartPole-v1", 4, seed=3)
            assert env.reset()[0].tobytes() == local.reset()[0].tobytes()
            local.close()
        # ... and the hog's first make is still in flight
        assert not hog.socket.poll(0), "the hog got a reply"
        assert hog_row(watcher.status(), hog) == {
            "client": hog.socket.getsockopt(zmq.ROUTING_ID).hex()[:8],
            "running": 1, "queued": 1, "refused": 0}

        # its queue holds at most --max-queued-ops: one more waits, the next is refused
        hog.make()
        refused = hog.make()
        reply = hog.recv()
        assert reply["id"] == refused and reply["code"] == "limit_exceeded", reply
        assert "--max-queued-ops" in reply["message"], reply
        status = watcher.status()
        assert hog_row(status, hog) == {
            "client": hog.socket.getsockopt(zmq.ROUTING_ID).hex()[:8],
            "running": 1, "queued": 2, "refused": 1}
        assert status["operations"]["running"] == 1 and status["operations"]["queued"] == 2
        assert status["operations"]["refused"] == 1
        assert status["workers"] == 3  # the refused make reserved nothing
        assert {first, second}.isdisjoint({reply["id"]})
    finally:
        hog.close()


def test_a_client_that_leaves_takes_its_waiting_operations_with_it(harness):
    """A connection that queued makes and said bye: its waiting makes fail at
    once (their reservations freed), so they no longer hold --max-sessions
    for nobody; before, a new client's make was refused (the daemon holds its
    maximum of sessions) while the gone client's makes ran one by one."""
    daemon = harness.daemon("--threads", "2", "--lease-timeout", "60", "--import", "daemon_envs",
                            "--python-env", HANGING[3:], "--hosted-timeout", "600",
                            "--max-sessions", "3", env=DAEMON_ENV)
    watcher = harness.connect(daemon, timeout=DEADLINE)
    hog = Hog(daemon.endpoint)
    try:
        for _ in range(3):
            hog.make()
        wait_until(lambda: hog_row(watcher.status(), hog).get("queued") == 2,
                   what="the hog's makes to be taken in")
        hog.send({"type": "bye"})
        wait_until(lambda: hog_row(watcher.status(), hog).get("queued", 0) == 0,
                   what="the gone client's waiting makes to fail")
        assert hog_row(watcher.status(), hog)["running"] == 1  # (it hangs until killed)
        newcomer = harness.connect(daemon, timeout=DEADLINE)
        with newcomer.make("CartPole-v1", 2, seed=1) as env:
            env.reset()
    finally:
        hog.close()
