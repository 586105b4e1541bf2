"""The client's Channel (client/channel.py) against a scripted peer: request
ids, acks of large replies, posted requests and their window, late replies,
requests queued from finalizers, the size limit.  No daemon: a ROUTER socket
in a thread answers as the test says."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import zmq

from envd import protocol
from envd.client.channel import Channel
from envd.errors import EnvdTimeoutError, LimitExceededError, UnknownSessionError

Answer = Callable[[dict[str, Any]], "dict[str, Any] | None"]


def ok(request: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return protocol.ok_reply(request["id"], **fields)


class Peer(threading.Thread):
    """A ROUTER that records every request and replies answer(request);
    None holds the reply until release()."""

    def __init__(self, folder, answer: Answer):
        super().__init__(daemon=True)
        self.endpoint = f"ipc://{folder}/peer.sock"
        self.answer = answer
        self.requests: list[dict[str, Any]] = []
        self.held: list[tuple[bytes, dict[str, Any]]] = []
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.bind(self.endpoint)
        self._lock = threading.Lock()
        self._release = threading.Event()
        self._stopping = threading.Event()

    def run(self) -> None:
        try:
            while not self._stopping.is_set():
                if self._release.is_set():
                    self._release.clear()
                    with self._lock:
                        held, self.held = self.held, []
                    for identity, reply in held:
                        self._socket.send_multipart([identity, protocol.pack(reply)])
                if not self._socket.poll(20):
                    continue
                identity, header, *_ = self._socket.recv_multipart()
                request = protocol.unpack(header, 1 << 20)
                with self._lock:
                    self.requests.append(request)
                reply = self.answer(request)
                if reply is None:
                    with self._lock:
                        self.held.append((identity, ok(request)))
                    continue
                frames = [protocol.pack({k: v for k, v in reply.items() if k != "_blobs"}),
                          *reply.get("_blobs", [])]
                self._socket.send_multipart([identity, *frames])
        finally:
            self._socket.close(linger=0)
            self._context.term()

    def release(self) -> None:
        """Send the held replies."""
        self._release.set()

    def types(self) -> list[str]:
        with self._lock:
            return [r["type"] for r in self.requests]

    def stop(self) -> None:
        self._stopping.set()
        self.join()


@pytest.fixture
def peer_with(tmp_path):
    peers, channels = [], []

    def start(answer: Answer, timeout: float = 30.0) -> tuple[Peer, Channel]:
        peer = Peer(tmp_path, answer)
        peer.start()
        channel = Channel(peer.endpoint, timeout, {})
        peers.append(peer)
        channels.append(channel)
        return peer, channel

    yield start
    for channel in channels:
        channel.close()
    for peer in peers:
        peer.stop()


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_requests_get_ids_and_large_replies_are_acknowledged(peer_with):
    def answer(request):
        if request["type"] == "render":  # a large reply: it carries a token
            return ok(request, token=1234, _blobs=[b"x" * 10])
        return ok(request, echo=request["type"])

    peer, channel = peer_with(answer)
    assert channel.request({"type": "status"})["echo"] == "status"
    reply = channel.request({"type": "render", "session": "s"})
    assert bytes(reply["_blobs"][0]) == b"x" * 10
    channel.request({"type": "status"})
    ids = [r["id"] for r in peer.requests]
    assert ids == sorted(set(ids))  # one id per request, increasing
    assert "ack" not in peer.requests[1] and peer.requests[2]["ack"] == 1234


def test_an_error_reply_raises_its_exception(peer_with):
    _, channel = peer_with(lambda request: {"id": request["id"], "ok": False,
                                            "code": "unknown_session", "message": "no such"})
    with pytest.raises(UnknownSessionError, match="no such"):
        channel.request({"type": "close", "session": "s"})


def test_a_posted_reply_reaches_its_callback_and_the_window_bounds_posts(peer_with):
    peer, channel = peer_with(lambda request: None if request["type"] == "send" else ok(request))
    channel.timeout = 0.5  # only waited out while the peer holds every reply (an event)
    replies = []
    for _ in range(protocol.POSTED_WINDOW):
        channel.post({"type": "send", "session": "s"}, [b"\0" * 8], replies.append)
    assert channel.unanswered == protocol.POSTED_WINDOW
    with pytest.raises(EnvdTimeoutError, match="posted requests"):
        channel.post({"type": "send", "session": "s"}, [b"\0" * 8], replies.append)
    assert peer.types().count("send") == protocol.POSTED_WINDOW  # the last one was not sent
    peer.release()
    wait_for(lambda: not peer.held, "the held replies to go out")
    channel.timeout = 30.0
    channel.request({"type": "status"})  # reads the replies that came before its own
    assert len(replies) == protocol.POSTED_WINDOW and all(r["ok"] for r in replies)
    assert channel.unanswered == 0


def test_a_late_reply_runs_the_timed_out_requests_callback(peer_with):
    peer, channel = peer_with(lambda request: None if request["type"] == "step" else ok(request))
    channel.timeout = 0.2  # only waited out while the peer holds the step's reply (an event)
    late = []
    with pytest.raises(EnvdTimeoutError, match="'step'"):
        channel.request({"type": "step", "session": "s"}, late=late.append)
    assert channel.unanswered == 1 and late == []
    peer.release()
    wait_for(lambda: (channel.read_late_replies(wait=0.05), late)[1], "the late reply")
    assert late[0]["ok"] and channel.unanswered == 0


def test_a_reply_whose_id_is_not_an_int_is_nobodys(peer_with):
    """The daemon's reply ids are not trusted: a list (unhashable) answers
    nothing and breaks nothing (it was a TypeError of the books' lookup)."""
    def answer(request):
        if request["type"] == "send":
            return {"id": [request["id"]], "ok": True}
        return ok(request)

    peer, channel = peer_with(answer)
    replies = []
    channel.post({"type": "send", "session": "s"}, [b"\0" * 8], replies.append)
    wait_for(lambda: "send" in peer.types(), "the send")
    assert channel.request({"type": "status"})["ok"]  # read the stray reply first
    assert replies == [] and channel.unanswered == 1


def test_requests_queued_by_a_finalizer_go_before_the_next_request(peer_with):
    peer, channel = peer_with(ok)
    channel.post_later({"type": "close", "session": "gone"})
    assert peer.types() == []  # queued, nothing sent from the queuing thread
    channel.request({"type": "status"})
    assert peer.types() == ["close", "status"]
    assert peer.requests[0]["session"] == "gone"


def test_a_message_over_the_limit_is_refused_before_sending(peer_with):
    peer, channel = peer_with(ok)
    channel.max_message_bytes = 1000
    with pytest.raises(LimitExceededError, match="over the daemon's limit of 1000"):
        channel.request({"type": "step", "session": "s"}, [b"\0" * 2000])
    channel.request({"type": "status"})
    assert peer.types() == ["status"]
