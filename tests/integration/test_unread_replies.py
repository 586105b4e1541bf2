"""Replies a client leaves unread (issue 15, defects 2 and 3; SECURITY.md).

A hostile client that sends requests and never reads their replies must not
make the daemon hold more than the documented budget: its requests are
refused, then the client is dropped, with a log line, while a bystander keeps
stepping bit-exactly.  The official client acknowledges what it reads and
flow-controls its posted sends, so it never loses a reply, however many sends
it posts."""
from __future__ import annotations

import os
import time

import msgpack
import numpy as np
import pytest
import zmq
from support.daemon import DEADLINE, Bystander, DaemonProcess, rss_bytes, wait_until

from envd import protocol

MiB = 1 << 20
#: --max-message-bytes of these daemons: the reply budgets derive from it
#: (per connection 2 x, in total 8 x; SECURITY.md).
MESSAGE_BYTES = 4 * MiB
#: What the daemon may grow by besides the budget of the one offender: its
#: queue of small replies (REPLY_QUEUE x SMALL_REPLY_BYTES, 4 MiB) and
#: allocator slack.
SLACK = 32 * MiB
DROPPED_LINE = "dropped a client that does not read its replies"


class Deaf:
    """A raw DEALER client that reads only what it asks to: its socket takes
    in at most one reply (RCVHWM 1, a small kernel buffer), so what it leaves
    unread stays queued in the daemon."""

    def __init__(self, endpoint: str):
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.ROUTING_ID, b"\x01" + os.urandom(15))
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.RCVHWM, 1)
        self.socket.setsockopt(zmq.RCVBUF, 4096)
        self.socket.connect(endpoint)
        self.ids = iter(range(1, 1 << 30))

    def post(self, header: dict, *blobs: bytes) -> int:
        request_id = next(self.ids)
        header = {**header, "id": request_id}
        self.socket.send_multipart([msgpack.packb(header, use_bin_type=True), *blobs])
        return request_id

    def ask(self, header: dict, *blobs: bytes) -> tuple[dict, list[bytes]]:
        """The reply to header; earlier replies still queued (a stalled
        daemon sends them after a drain gave up on them) are skipped."""
        request_id = self.post(header, *blobs)
        end = time.monotonic() + DEADLINE
        while True:
            remaining_ms = max(0, int((end - time.monotonic()) * 1000))
            assert self.socket.poll(remaining_ms), f"no reply to {header}"
            frames = self.socket.recv_multipart()
            reply = msgpack.unpackb(frames[0], raw=False)
            if reply.get("id") == request_id:
                return reply, frames[1:]

    def ok(self, header: dict, *blobs: bytes) -> dict:
        reply, _ = self.ask(header, *blobs)
        assert reply["ok"], reply
        return reply

    def close(self) -> None:
        self.socket.close(linger=0)
        self.context.term()


@pytest.fixture
def daemon(tmp_path):
    with DaemonProcess(tmp_path / "daemon", "--threads", "2", "--lease-timeout", "60",
                       "--max-message-bytes", str(MESSAGE_BYTES),
                       "--max-sessions-per-client", "1024") as daemon:
        yield daemon


def attack_and_check(daemon: DaemonProcess, deaf: Deaf, attack) -> None:
    """Run attack (it sends and reads nothing), then: the daemon's RSS grew by
    at most one connection's budget plus SLACK, the offender was dropped with
    a log line, and the bystander still steps bit-exactly."""
    bystander = Bystander(daemon)
    try:
        baseline = rss_bytes(daemon.pid)
        bound = baseline + 2 * MESSAGE_BYTES + SLACK
        attack()
        peak = baseline

        def settled() -> bool:  # the offender is dropped, or the daemon is over the bound
            nonlocal peak
            peak = max(peak, rss_bytes(daemon.pid))
            return peak > bound or DROPPED_LINE in daemon.log()
        wait_until(settled, what="the offender to be dropped")
        time.sleep(1.0)  # what the daemon still had in hand
        peak = max(peak, rss_bytes(daemon.pid))
        print(f"daemon RSS: baseline {baseline / MiB:.1f} MiB, peak {peak / MiB:.1f} MiB, "
              f"bound {bound / MiB:.1f} MiB")
        assert peak <= bound, (f"daemon RSS grew from {baseline / MiB:.1f} MiB to "
                               f"{peak / MiB:.1f} MiB, over the bound of {bound / MiB:.1f}")
        assert DROPPED_LINE in daemon.log()
        bystander.check()
        status = bystander.client.status()
        assert status["dropped_clients"] == 1
        assert status["unread_reply_bytes"] <= 2 * MESSAGE_BYTES
        # the offender's later requests get connection_lost (once it reads again)
        while deaf.socket.poll(200):
            deaf.socket.recv_multipart()
        reply, _ = deaf.ask({"type": "status"})
        assert reply["code"] == "connection_lost" and "did not read" in reply["message"]
    finally:
        bystander.close()
        deaf.close()


def test_inline_resets_never_read_stay_bounded(daemon):
    deaf = Deaf(daemon.endpoint)
    deaf.ok({"type": "hello", "version": protocol.PROTOCOL_VERSION})
    # 300 Snake envs: each inline reset answers with ~2 MiB of observations
    sessions = [deaf.ok({"type": "make", "env_id": "Snake-v0", "num_envs": 300,
                         "seed": k})["session"] for k in range(4)]
    reply, blobs = deaf.ask({"type": "reset", "session": sessions[0], "inline": True})
    assert reply["ok"] and sum(map(len, blobs)) > MiB

    def attack() -> None:  # paced, so that few resets find their session busy
        for k in range(160):
            deaf.post({"type": "reset", "session": sessions[k % 4], "inline": True})
            time.sleep(0.02)
        for _ in range(1100):  # small replies until its queue (REPLY_QUEUE: 1000) is full
            deaf.post({"type": "status"})
    attack_and_check(daemon, deaf, attack)


def test_status_spam_never_read_stays_bounded(daemon):
    deaf = Deaf(daemon.endpoint)
    deaf.ok({"type": "hello", "version": protocol.PROTOCOL_VERSION})
    for _ in range(1000):  # a status then lists 1000 sessions: ~85 KB
        deaf.ok({"type": "make", "env_id": "CartPole-v1", "num_envs": 1})
    reply, _ = deaf.ask({"type": "status"})
    assert len(msgpack.packb(reply)) > 64 << 10

    def attack() -> None:
        for _ in range(1500):
            deaf.post({"type": "status"})
    attack_and_check(daemon, deaf, attack)


def test_unacknowledged_replies_are_refused_until_acknowledged(daemon):
    """A client that reads its replies but does not acknowledge them is
    refused once over its budget; a made-up token frees nothing; the right
    one frees everything before it."""
    deaf = Deaf(daemon.endpoint)
    try:
        deaf.ok({"type": "hello", "version": protocol.PROTOCOL_VERSION})
        session = deaf.ok({"type": "make", "env_id": "Snake-v0", "num_envs": 300,
                           "seed": 0})["session"]
        tokens = []
        while True:
            reply, _ = deaf.ask({"type": "reset", "session": session, "inline": True})
            if not reply["ok"]:
                break
            tokens.append(reply["token"])
            assert len(tokens) < 10, "never refused"
        assert reply["code"] == "limit_exceeded", reply
        assert "--max-reply-bytes-per-client" in reply["message"]
        assert len(tokens) >= 2  # the budget holds more than one such reply
        reply, _ = deaf.ask({"type": "reset", "session": session, "inline": True,
                             "ack": tokens[-1] ^ 1})
        assert reply["code"] == "limit_exceeded", "a made-up token acknowledged something"
        reply, blobs = deaf.ask({"type": "reset", "session": session, "inline": True,
                                 "ack": tokens[-1]})
        assert reply["ok"] and "token" in reply and len(blobs) > 0
        reply, _ = deaf.ask({"type": "status", "ack": "x"})
        assert reply["code"] == "bad_request" and "'ack'" in reply["message"]
    finally:
        deaf.close()


def test_the_official_client_acknowledges_its_replies(daemon):
    """Many more reply bytes than the budget over the inline transport: the
    client's acks keep its books empty, nothing is refused."""
    with daemon.connect() as client, client.make("Snake-v0", 300, seed=5,
                                                 transport="inline") as env:
        rng = np.random.default_rng(0)
        for _ in range(3):
            env.reset(seed=1)
            for _ in range(10):  # 30 x 2 MiB, the budget is 8 MiB
                env.step(rng.integers(0, 4, size=300))
        assert client.status()["unread_reply_bytes"] == 0


@pytest.mark.parametrize("transport", ["shm", "inline"])
def test_thousands_of_posted_sends_lose_no_reply(daemon, transport):
    """Defect 3: 4096 posted sends over the socket, then async_reset: every
    send's reply is read (none dropped by a full queue), nothing waits out
    the timeout."""
    timeout = DEADLINE
    with daemon.connect(timeout=timeout) as client, \
            client.make("CartPole-v1", 4096, seed=0, batch_size=4096, transport=transport,
                        fast_path=False) as env:
        env.async_reset()
        ids = env.recv()[4]["env_id"]
        assert len(ids) == 4096
        started = time.monotonic()
        for i in ids:
            env.send(np.zeros(1, np.int64), [int(i)])
        env.async_reset()  # reads every send's reply, then resets
        elapsed = time.monotonic() - started
        # A send whose reply was waited for until the timeout would alone
        # take the timeout: under it, none was (whatever the machine's speed).
        assert elapsed < timeout, f"4096 sends and a reset took {elapsed:.1f} s"
        assert env._stepper.sends_unanswered == 0 and not env._stepper.async_lost
        assert len(env.recv()[4]["env_id"]) == 4096
        assert client.status()["dropped_clients"] == 0
    assert DROPPED_LINE not in daemon.log()
