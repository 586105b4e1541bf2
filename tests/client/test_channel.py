"""The client's Channel (client/channel.py) against a scripted peer: request
ids, acks of large replies, posted requests and their window, a wait for a
posted reply, late replies, requests queued from finalizers, the size limit,
a liveness check while another thread holds the channel.  No daemon: a
ROUTER socket in a thread answers as the test says."""
from __future__ import annotations

import threading
import time
import types
from collections.abc import Callable
from typing import Any

import pytest
import zmq

from envd import protocol
from envd.client import channel as channel_module
from envd.client.channel import Channel
from envd.client.transports.waiting import SocketWaiter
from envd.errors import (
    ConnectionLostError,
    EnvdTimeoutError,
    EnvStateError,
    LimitExceededError,
    UnknownSessionError,
)

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


def test_a_wait_for_a_posted_reply_returns_it_and_its_callback_never_runs(peer_with):
    """Error replies too (the caller reads them); a reply another request
    read first went to the callback, and the wait says so (None)."""
    peer, channel = peer_with(lambda request: (ok(request) if request["type"] != "recv" else
                                               protocol.error_reply(request["id"],
                                                                    EnvStateError("too few"))))
    called = []
    step = channel.post({"type": "step", "session": "s"}, [], called.append)
    recv = channel.post({"type": "recv", "session": "s"}, [], called.append)
    reply = channel.wait_posted(recv, "recv")  # (the step's reply came first: its callback)
    assert isinstance(protocol.error_from_reply(reply), EnvStateError)
    assert [reply["id"] for reply in called] == [step] and channel.wait_posted(step, "step") is None
    assert channel.unanswered == 0


def test_a_wait_for_a_posted_reply_ends_at_its_deadline(peer_with):
    """A deadline sooner than the timeout ends the wait (the error still
    names the Client timeout: a caller waiting for several daemons shares
    one deadline); a reply that is in is read even once it passed."""
    peer, channel = peer_with(lambda request: None if request["type"] == "step" else ok(request))
    step = channel.post({"type": "step", "session": "s"}, [], lambda reply: None)
    started = time.monotonic()
    with pytest.raises(EnvdTimeoutError, match=r"'step'.* within 30 s \(Client timeout\)"):
        channel.wait_posted(step, "step", started + 0.2)
    assert time.monotonic() - started < 15  # (the deadline, not the 30 s timeout)
    status = channel.post({"type": "status"}, [], lambda reply: None)
    wait_for(lambda: channel.pollables()[0].poll(0), "the status reply")
    reply = channel.wait_posted(status, "status", time.monotonic() - 1.0)
    assert reply is not None and reply["ok"] and reply["id"] == status


def test_past_its_deadline_a_wait_reads_only_so_many_replies(peer_with, monkeypatch):
    """A daemon that keeps sending cannot hold a wait past its deadline:
    it reads at most _READS_PAST_DEADLINE messages of what came."""
    monkeypatch.setattr(channel_module, "_READS_PAST_DEADLINE", 3)
    peer, channel = peer_with(lambda request: None if request["type"] == "step" else ok(request))
    for _ in range(5):
        channel.post({"type": "status"}, [], lambda reply: None)
    step = channel.post({"type": "step", "session": "s"}, [], lambda reply: None)
    wait_for(lambda: "step" in peer.types(), "the step (the status replies are out before it)")
    with pytest.raises(EnvdTimeoutError, match="'step'"):
        channel.wait_posted(step, "step", time.monotonic() - 1.0)
    assert channel.unanswered >= 1 + 5 - 3  # (the step's, and the status replies not read)


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


def test_a_liveness_check_waits_for_a_lock_held_elsewhere_instead_of_spinning(peer_with):
    """The daemon went (its disconnect unread on the monitor) while another
    thread holds the channel without reading the monitor (a read of late
    replies with a wait): a caller waiting on the channel's sockets finds
    the monitor readable each time; its liveness check waits for the lock
    (a bounded while), so its loop sleeps instead of spinning, and names the
    lost daemon once the lock is free."""
    peer, channel = peer_with(ok)
    channel.request({"type": "status"})  # (connected: the peer's going is a disconnect)
    peer.stop()
    monitor = channel.pollables()[1]
    wait_for(lambda: monitor.poll(0), "the disconnect reported on the monitor")
    holder = threading.Thread(target=channel.read_late_replies, kwargs={"wait": 1.5})
    holder.start()
    wait_for(lambda: channel.busy, "the other thread holding the channel")
    stepper = types.SimpleNamespace(waitables=lambda ticket: channel.pollables())
    waiter, rounds, lost = SocketWaiter(), 0, False
    started = time.monotonic()
    while time.monotonic() - started < 0.3 and not lost:
        ready, check = waiter.wait([(0, stepper, None)], 1.0)
        rounds += 1
        try:
            for _ in check:
                channel.check_alive("a test's recv")
        except ConnectionLostError:
            lost = True  # (this machine let the holder finish first)
    elapsed = time.monotonic() - started
    waiter.close()
    holder.join(30)
    assert rounds <= elapsed / channel_module._LOCK_BACKOFF_S + 2, (rounds, elapsed)
    with pytest.raises(ConnectionLostError, match="while waiting for a test's recv"):
        channel.check_alive("a test's recv")
