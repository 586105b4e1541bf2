"""Capabilities at hello (docs/protocol.md, "Capabilities"): the daemon says
what it serves and the client decides from that, never by trying a request
and reading the refusal."""
from __future__ import annotations

import dataclasses
import os
import secrets
import socket
import threading

import gymnasium as gym
import numpy as np
import pytest
import zmq
from gymnasium.vector import AutoresetMode
from support.daemon import DaemonProcess

import envd
from envd import _native_facts, protocol
from envd.buffer_layout import buffer_layout
from envd.shm import Segment, plan


def test_the_hello_advertises_what_the_daemon_serves(daemon):
    from envd.native._envd_native import lib  # the daemon runs this very core
    with daemon.connect() as client:
        wire = client.server_info["capabilities"]
        assert wire == {"protocol": protocol.PROTOCOL_VERSION, "abi": lib.envd_abi_version(),
                        "fast_path": True, "async": True, "inline": True, "render": True,
                        "recv_min": True, "max_threads": True,
                        "doorbell_layout": _native_facts.DOORBELL_LAYOUT,
                        "limits": client.server_info["limits"]}
        caps = client.capabilities
        assert caps.advertised and caps.fast_path and caps.recv_min and caps.max_threads
        assert caps.limits["max_message_bytes"] == client.status()["limits"]["max_message_bytes"]


def never_asks_for_the_fast_path(client, refusal: str) -> None:
    """client's envs step over the socket without a ``fast`` request, and
    make(fast_path=True) raises InvalidArgumentError matching refusal
    (closing the refused make's session)."""
    sent = []
    real = client.channel.request
    client.channel.request = lambda header, *a, **k: (sent.append(header["type"]),
                                                      real(header, *a, **k))[1]
    with client.make("CartPole-v1", 2, seed=0) as env:
        assert not env.fast_path
        env.reset()
        env.step(np.zeros(2, np.int64))
    assert "fast" not in sent, sent
    with pytest.raises(envd.InvalidArgumentError, match=refusal):
        client.make("CartPole-v1", 2, seed=0, fast_path=True)
    assert client.status()["sessions"] == 0  # the refused make's session is closed


def test_a_daemon_without_the_fast_path_is_never_asked_for_it(tmp_path):
    with DaemonProcess(tmp_path, "--threads", "1", "--fast-path-sessions", "0") as daemon:
        with daemon.connect() as client:
            assert not client.capabilities.fast_path
            never_asks_for_the_fast_path(client, "does not offer the fast path")


def test_a_daemon_of_another_doorbell_layout_is_never_asked_for_it(daemon):
    """A daemon whose doorbells have another layout (another envd version:
    its hello's doorbell_layout) steps over the socket: the client would
    misread its answers (its SENDRECV, its message's offset)."""
    with daemon.connect() as client:
        client.capabilities = dataclasses.replace(client.capabilities, doorbell_layout=1)
        never_asks_for_the_fast_path(client, "doorbells of layout 1")


class OldDaemon(threading.Thread):
    """A daemon older than capabilities, as far as a make: its hello has no
    ``capabilities``, and it answers ``fast`` (which it does not know) with
    bad_request, as such daemons did.  It records every request type."""

    def __init__(self, folder, capabilities: dict | None = None):
        super().__init__(daemon=True)
        self.endpoint = f"ipc://{folder}/old.sock"
        self.capabilities = capabilities  # None: an old daemon's hello, without them
        self.requests: list[str] = []
        self.segments: list[Segment] = []
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.bind(self.endpoint)
        self._stopping = threading.Event()

    def run(self) -> None:
        try:
            while not self._stopping.is_set():
                if not self._socket.poll(50):
                    continue
                identity, header, *_ = self._socket.recv_multipart()
                request = protocol.unpack(header, 1 << 20)
                self.requests.append(request["type"])
                reply = self._answer(request)
                self._socket.send_multipart([identity, protocol.pack(reply)])
        finally:
            self._socket.close(linger=0)
            self._context.term()

    def _answer(self, request: dict) -> dict:
        kind, request_id = request["type"], request.get("id")
        if kind == "hello":
            extra = {} if self.capabilities is None else {"capabilities": self.capabilities}
            return protocol.ok_reply(
                request_id, version=protocol.PROTOCOL_VERSION, server="envd 0.old",
                pid=os.getpid(), hostname=socket.gethostname(), lease_timeout=30.0,
                heartbeat_interval=1.0, limits={"max_message_bytes": 1 << 20}, **extra)
        if kind == "make":
            return self._make(request)
        if kind in ("heartbeat", "close", "bye"):
            return protocol.ok_reply(request_id)
        return {"id": request_id, "ok": False, "code": "bad_request",
                "message": f"unknown message type {kind!r}"}

    def _make(self, request: dict) -> dict:
        spec = gym.make("CartPole-v1")
        n = request["num_envs"]
        layout = buffer_layout(spec.observation_space, spec.action_space, n,
                               AutoresetMode.NEXT_STEP)
        layout["doorbell_ids"] = ((n,), np.dtype(np.int64))
        arrays, size = plan(layout)
        session = secrets.token_hex(16)
        segment = Segment.create(f"envd-test-old-{secrets.token_hex(8)}", session, arrays, size)
        self.segments.append(segment)
        return protocol.ok_reply(
            request["id"], session=session, env_id="CartPole-v1",
            shm={"name": segment.name, "size": size, "arrays": arrays},
            observation_space=protocol.space_to_wire(spec.observation_space),
            action_space=protocol.space_to_wire(spec.action_space), max_episode_steps=500,
            autoreset_mode="next_step", render_mode=None, render_fps=None)

    def stop(self) -> None:
        self._stopping.set()
        self.join()
        for segment in self.segments:
            segment.unlink()


@pytest.fixture
def old_daemon(tmp_path):
    daemon = OldDaemon(tmp_path)
    daemon.start()
    yield daemon
    daemon.stop()


def test_an_old_daemon_without_capabilities_gets_the_fallback_and_no_trial(old_daemon):
    with envd.connect(old_daemon.endpoint, timeout=10) as client:
        assert not client.capabilities.advertised
        assert not client.capabilities.fast_path
        assert client.capabilities.limits == {"max_message_bytes": 1 << 20}
        env = client.make("CartPole-v1", 2, seed=0)
        assert not env.fast_path and env.transport == "shm"
        with pytest.raises(envd.InvalidArgumentError, match="does not offer the fast path"):
            client.make("CartPole-v1", 2, seed=0, fast_path=True)
        # such a daemon would ignore the field and step on its whole pool: refused here
        with pytest.raises(envd.InvalidArgumentError,
                           match=r"does not serve per-session thread caps \(max_threads\)"):
            client.make("CartPole-v1", 2, seed=0, max_threads=0)
        env.close()
    # the client never tried "fast" to find out what the daemon serves
    assert "fast" not in old_daemon.requests, old_daemon.requests
    assert old_daemon.requests.count("make") == 2


def test_what_the_daemon_does_not_serve_is_refused_before_any_make(tmp_path):
    daemon = OldDaemon(tmp_path, {"protocol": protocol.PROTOCOL_VERSION, "abi": 3,
                                  "fast_path": False, "async": False, "inline": False,
                                  "render": False, "limits": {"max_message_bytes": 1 << 20}})
    daemon.start()
    try:
        with envd.connect(daemon.endpoint, timeout=10) as client:
            for kwargs, what in ((dict(batch_size=1), "async mode"),
                                 (dict(render_mode="rgb_array"), "rendering"),
                                 (dict(transport="inline"), "the inline transport"),
                                 (dict(max_threads=1), "per-session thread caps")):
                with pytest.raises(envd.InvalidArgumentError, match=f"does not serve {what}"):
                    client.make("CartPole-v1", 2, seed=0, **kwargs)
            with client.make("CartPole-v1", 2, seed=0, batch_size=2) as env:  # sync: served
                assert env.transport == "shm" and not env.fast_path
    finally:
        daemon.stop()
    assert daemon.requests.count("make") == 1 and "fast" not in daemon.requests
