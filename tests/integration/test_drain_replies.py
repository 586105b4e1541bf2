"""Every request that reaches the daemon gets exactly one reply, also when it
races SIGTERM's drain (issue 15, defect 10); and request ids are the
client's to choose: the daemon echoes them and runs each request it reads
(docs/protocol.md, "Request ids")."""
from __future__ import annotations

import signal
import threading

import msgpack
import numpy as np
import zmq
from support.daemon import DEADLINE

import envd
from envd import protocol

#: Requests queued while the daemon is stopped, answered across the drain.
QUEUED = 1000


def test_requests_queued_as_the_drain_ends_each_get_one_reply(harness):
    """The daemon is stopped (SIGSTOP) while a raw client queues QUEUED
    requests and an official client one more; then SIGTERM and SIGCONT: the
    drain finds nothing running and ends at once, with most requests still
    queued.  Each must get exactly one reply, ok (read before the signal) or
    shutting_down, and the official client raises ShuttingDownError, not
    ConnectionLostError."""
    daemon = harness.daemon("--threads", "1")
    official = daemon.connect(timeout=DEADLINE)
    context = zmq.Context()
    raw = context.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.setsockopt(zmq.SNDHWM, 0)
    raw.setsockopt(zmq.RCVHWM, 0)
    raw.connect(daemon.endpoint)
    outcome: dict = {}
    try:
        raw.send(protocol.pack({"type": "hello", "id": 1, "version": protocol.PROTOCOL_VERSION}))
        assert raw.poll(DEADLINE * 1000)
        assert msgpack.unpackb(raw.recv(), raw=False)["ok"]
        daemon.signal(signal.SIGSTOP)
        for request_id in range(2, 2 + QUEUED):
            raw.send(protocol.pack({"type": "list_envs", "id": request_id}))

        def ask() -> None:
            try:
                outcome["envs"] = official.list_envs()
            except envd.EnvdError as exc:
                outcome["error"] = exc

        # The signals go once the official client has sent its request (an
        # event: a loaded machine may start the asker thread late, and a
        # request sent after the daemon exited is not one it must answer).
        sent = threading.Event()
        send_request = official.channel._send

        def send_and_tell(*args, **kwargs):
            try:
                return send_request(*args, **kwargs)
            finally:
                sent.set()
        official.channel._send = send_and_tell
        asker = threading.Thread(target=ask)
        asker.start()
        assert sent.wait(DEADLINE), "the official client never sent its request"
        daemon.proc.send_signal(signal.SIGTERM)
        daemon.proc.send_signal(signal.SIGCONT)
        replies: dict[int, list[dict]] = {}
        while sum(map(len, replies.values())) < QUEUED and raw.poll(DEADLINE * 1000):
            reply = msgpack.unpackb(raw.recv_multipart()[0], raw=False)
            replies.setdefault(reply["id"], []).append(reply)
        asker.join(DEADLINE)
        assert daemon.wait() == 0, daemon.log()
    finally:
        raw.close(0)
        context.term()
        official.timeout = 2.0
    assert sorted(replies) == list(range(2, 2 + QUEUED)), (
        f"{QUEUED - len(replies)} requests got no reply\n{daemon.log()[-2000:]}")
    assert all(len(got) == 1 for got in replies.values())
    codes = {"ok" if r["ok"] else r["code"] for (r,) in replies.values()}
    assert codes <= {"ok", "shutting_down"}, codes
    assert "shutting_down" in codes
    assert "envs" in outcome or isinstance(outcome.get("error"), envd.ShuttingDownError), outcome


def test_a_repeated_request_id_is_run_and_answered_each_time(daemon):
    """Ids only match replies to requests: the daemon keeps no record of
    them, so a request sent twice with one id runs twice."""
    context = zmq.Context()
    raw = context.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(daemon.endpoint)

    def ask(header: dict, *blobs: bytes) -> dict:
        raw.send_multipart([protocol.pack(header), *blobs])
        assert raw.poll(DEADLINE * 1000)
        return msgpack.unpackb(raw.recv_multipart()[0], raw=False)

    try:
        assert ask({"type": "hello", "id": 7, "version": protocol.PROTOCOL_VERSION})["ok"]
        session = ask({"type": "make", "id": 7, "env_id": "CartPole-v1", "num_envs": 2,
                       "seed": 3})["session"]
        assert ask({"type": "reset", "id": 7, "session": session, "inline": True})["ok"]
        twin = envd.make("CartPole-v1", 2, seed=3)
        twin.reset()
        actions = np.array([1, 0])
        for _ in range(2):  # the same request twice: two steps
            reply = ask({"type": "step", "id": 7, "session": session, "inline": True,
                         "actions": {"dtype": "<i8", "shape": [2]}}, actions.astype("<i8").tobytes())
            assert reply["id"] == 7 and reply["ok"], reply
            twin.step(actions)
        raw.send_multipart([protocol.pack({"type": "step", "id": 7, "session": session,
                                           "inline": True, "actions": {"dtype": "<i8",
                                                                       "shape": [2]}}),
                            actions.astype("<i8").tobytes()])
        assert raw.poll(DEADLINE * 1000)
        frames = raw.recv_multipart()
        header = msgpack.unpackb(frames[0], raw=False)
        observations = frames[1 + header["arrays"].index("observations")]
        assert observations == twin.step(actions)[0].tobytes()  # the third step
        twin.close()
    finally:
        raw.close(0)
        context.term()
