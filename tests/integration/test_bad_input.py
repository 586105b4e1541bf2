"""Hostile and broken clients against a real daemon.

Raw DEALER sockets send malformed, mistyped, out-of-order and oversized
requests.  Each one must get an error reply with the right code and a message
for a human (never a traceback), and meanwhile the daemon keeps serving its
other clients: a well-behaved client that made envs before the attack still
steps them afterwards with results equal bit for bit to in-process twins.
"""
from __future__ import annotations

import math
import os
import random
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq
from support.daemon import DEADLINE, Bystander, segments_of, start_daemon, stop_daemon, wait_until
from zmq.utils.monitor import recv_monitor_message

import envd
from envd import protocol
from envd.shm import Segment

MAX_MESSAGE_BYTES = 1 << 20
KNOWN_TYPES = ["hello", "heartbeat", "list_envs", "status", "make", "reset", "step", "close"]


# ---- fixtures and helpers ---------------------------------------------------------------

@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """One daemon for the tests of this module that need no special flags."""
    proc = start_daemon(tmp_path_factory.mktemp("bad_input"),
                        "--max-message-bytes", str(MAX_MESSAGE_BYTES))
    try:
        yield proc
    finally:
        stop_daemon(proc)


@pytest.fixture
def victim(served):
    v = Bystander(served)
    try:
        yield v
        v.check()
    finally:
        v.close()


def clean_message(message: Any) -> None:
    assert isinstance(message, str) and message.strip(), message
    assert "Traceback" not in message and 'File "' not in message, message


def _request_id(header: dict | bytes) -> int | None:
    """The id the daemon echoes: the int "id" of a header that is a map (and
    no larger than the daemon's header cap), else None."""
    if isinstance(header, dict) and len(protocol.pack(header)) > protocol.DEFAULT_MAX_HEADER_BYTES:
        return None
    if isinstance(header, bytes):
        try:
            # as the daemon decodes it
            header = protocol.unpack(header, protocol.DEFAULT_MAX_HEADER_BYTES)
        except protocol.BadRequest:
            return None
    if isinstance(header, dict) and type(header.get("id")) is int:
        return header["id"]
    return None


class Raw:
    """A raw DEALER socket speaking the protocol by hand."""

    def __init__(self, context: zmq.Context, endpoint: str):
        self.socket = context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.ROUTING_ID, b"\x01" + os.urandom(15))
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(endpoint)
        self.monitor = None
        self._next_id = 100

    def close(self) -> None:
        if self.monitor is not None:
            self.socket.disable_monitor()
            self.monitor.close(linger=0)
        self.socket.close(linger=0)

    def next_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def send(self, header: dict | bytes, *blobs: bytes) -> None:
        frame = header if isinstance(header, bytes) else msgpack.packb(header, use_bin_type=True)
        self.socket.send_multipart([frame, *blobs])

    def recv(self, timeout: float = DEADLINE) -> dict:
        assert self.socket.poll(timeout * 1000), f"no reply within {timeout:g} s"
        frames = self.socket.recv_multipart()
        assert len(frames) == 1, frames
        reply = msgpack.unpackb(frames[0], raw=False)
        assert isinstance(reply, dict) and isinstance(reply.get("ok"), bool), reply
        return reply

    def ask(self, header: dict | bytes, *blobs: bytes) -> dict:
        """Send one request (an "id" is added to a map without one) and return its reply."""
        if isinstance(header, dict) and "id" not in header:
            header = {**header, "id": self.next_id()}
        self.send(header, *blobs)
        reply = self.recv()
        assert reply["id"] == _request_id(header), (header, reply)
        return reply

    def ok(self, header: dict, *blobs: bytes) -> dict:
        reply = self.ask(header, *blobs)
        assert reply["ok"] is True, reply
        return reply

    def error(self, header: dict | bytes, code: str, *words: str, blobs=()) -> str:
        """The request gets an error reply with this code, whose message has these words."""
        reply = self.ask(header, *blobs)
        assert reply["ok"] is False, reply
        assert code in protocol.ERROR_CODES
        assert reply["code"] == code, reply
        assert set(reply) == {"id", "ok", "code", "message"}, reply
        clean_message(reply["message"])
        for word in words:
            assert word in reply["message"], reply
        return reply["message"]

    def hello(self) -> dict:
        return self.ok({"type": "hello", "version": protocol.PROTOCOL_VERSION,
                        "client_name": "hostile test"})

    def make(self, env_id: str = "CartPole-v1", num_envs: int = 4, **fields) -> dict:
        return self.ok({"type": "make", "env_id": env_id, "num_envs": num_envs, **fields})


@pytest.fixture
def raw(served):
    """raw(hello=True) opens a DEALER socket on the module's daemon (or endpoint=...)."""
    context = zmq.Context()
    opened: list[Raw] = []

    def open_socket(hello: bool = True, endpoint: str | None = None) -> Raw:
        sock = Raw(context, endpoint or served.endpoint)
        opened.append(sock)
        if hello:
            sock.hello()
        return sock

    try:
        yield open_socket
    finally:
        for sock in opened:
            sock.close()
        context.term()


def attach(reply: dict) -> Segment:
    shm = reply["shm"]
    return Segment.attach(shm["name"], reply["session"], shm["arrays"], shm["size"], where="test")


def pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


# ---- malformed messages ---------------------------------------------------------------------

def test_random_bytes(victim, raw):
    attacker = raw()
    rng = np.random.default_rng(7)
    for size in (0, 1, 2, 7, 100, 4096, 100_000):
        for _ in range(3 if size else 1):
            frame = rng.bytes(size)
            attacker.error(frame, "bad_request", "msgpack")
    # several random frames in one message: the first is the header
    attacker.error(rng.bytes(50), "bad_request", blobs=(rng.bytes(10), b""))
    attacker.error(b"", "bad_request", "msgpack", blobs=(b"",))
    attacker.error(b"\xc1", "bad_request", "msgpack")
    attacker.error(pack({"type": "status", "id": 1})[:-1], "bad_request", "msgpack")
    attacker.error(pack({"type": "status", "id": 1}) + b"\x00", "bad_request", "msgpack")
    attacker.error(b"\x91" * 5000 + b"\xc0", "bad_request", "msgpack")  # too deep
    attacker.error(b"\xdd\xff\xff\xff\xff", "bad_request", "msgpack")  # a 4-billion array
    attacker.error(pack({1: 2}), "bad_request", "msgpack")  # int keys
    attacker.error(pack({"type": "status", "id": 1, "x": msgpack.ExtType(3, b"ext")}),
                   "bad_request", "msgpack")
    attacker.ok({"type": "status"})  # the attacker itself is still served


@pytest.mark.parametrize("value, words", [
    ([1, 2, 3], ["map", "list"]), ([], ["map"]), (5, ["map", "int"]), (-1, ["map"]),
    ("status", ["map", "str"]), (b"status", ["map", "bytes"]), (None, ["map"]),
    (True, ["map"]), (1.5, ["map", "float"]),
    ({}, ["'type'"]), ({"id": 1}, ["'type'"]), ({"type": "status"}, ["'id'"]),
    ({"type": 5, "id": 1}, ["'type'", "str"]), ({"type": None, "id": 1}, ["'type'"]),
    ({"type": "status", "id": True}, ["'id'", "int"]),
    ({"type": "status", "id": False}, ["'id'"]), ({"type": "status", "id": "1"}, ["'id'"]),
    ({"type": "status", "id": 1.0}, ["'id'"]), ({"type": "status", "id": None}, ["'id'"]),
    ({"type": "status", "id": [1]}, ["'id'"]),
], ids=repr)
def test_msgpack_of_the_wrong_shape(victim, raw, value, words):
    raw().error(pack(value), "bad_request", *words)


def test_unknown_message_type(victim, raw):
    attacker = raw()
    for kind in ("bogus", "", "Hello", "STEP", "handle", "__init__", "x" * 10000):
        message = attacker.error({"type": kind}, "unknown_type")
        for known in KNOWN_TYPES:
            assert known in message
    # before hello too
    raw(hello=False).error({"type": "nope"}, "unknown_type")


# field values of the wrong type: (header, code, words)
WRONG_FIELDS = [
    ({"type": "hello", "version": "1"}, "bad_request", ["'version'", "int"]),
    ({"type": "hello", "version": True}, "bad_request", ["'version'", "bool"]),
    ({"type": "hello", "version": 1.0}, "bad_request", ["'version'"]),
    ({"type": "hello", "version": 1, "client_name": 5}, "bad_request", ["'client_name'"]),
    ({"type": "hello", "version": 1, "client_name": b"me"}, "bad_request", ["'client_name'"]),
    ({"type": "heartbeat", "client": "abc"}, "bad_request", ["'client'", "bin"]),
    ({"type": "heartbeat", "client": 5}, "bad_request", ["'client'"]),
    ({"type": "make", "env_id": "CartPole-v1", "num_envs": "3"}, "bad_request",
     ["'num_envs'", "int", "str"]),
    ({"type": "make", "env_id": "CartPole-v1", "num_envs": 3.0}, "bad_request", ["'num_envs'"]),
    ({"type": "make", "env_id": "CartPole-v1", "num_envs": True}, "bad_request",
     ["'num_envs'", "bool"]),
    ({"type": "make", "env_id": "CartPole-v1", "num_envs": None}, "bad_request", ["'num_envs'"]),
    ({"type": "make", "env_id": 5, "num_envs": 1}, "bad_request", ["'env_id'", "str"]),
    ({"type": "make", "env_id": b"CartPole-v1", "num_envs": 1}, "bad_request", ["'env_id'"]),
    ({"type": "make", "num_envs": 1}, "bad_request", ["missing", "'env_id'"]),
    ({"type": "make", "env_id": "CartPole-v1"}, "bad_request", ["missing", "'num_envs'"]),
    ({"type": "make", "env_id": "CartPole-v1", "num_envs": 1, "seed": 1.5}, "invalid_argument",
     ["seed", "float"]),
    ({"type": "make", "env_id": "CartPole-v1", "num_envs": 1, "seed": "1"}, "invalid_argument",
     ["seed"]),
    ({"type": "make", "env_id": "CartPole-v1", "num_envs": 1, "seed": True}, "invalid_argument",
     ["seed"]),
    ({"type": "make", "env_id": "CartPole-v1", "num_envs": 1, "seed": -1}, "invalid_argument",
     ["seed"]),
    ({"type": "make", "env_id": "CartPole-v1", "num_envs": 2, "seed": [1]}, "invalid_argument",
     ["seed", "2"]),
    ({"type": "make", "env_id": "CartPole-v1", "num_envs": 2, "seed": [1, "2"]},
     "invalid_argument", ["seed"]),
    ({"type": "make", "env_id": "CartPole-v1", "num_envs": 1, "seed": {"a": 1}},
     "invalid_argument", ["seed"]),
    ({"type": "make", "env_id": "CartPole-v1", "num_envs": 1, "autoreset_mode": 1},
     "bad_request", ["'autoreset_mode'"]),
    ({"type": "make", "env_id": "CartPole-v1", "num_envs": 1, "autoreset_mode": "sometimes"},
     "invalid_argument", ["autoreset_mode", "next_step"]),
    ({"type": "make", "env_id": "CartPole-v1", "num_envs": 1, "max_episode_steps": 1.5},
     "invalid_argument", ["max_episode_steps"]),
    ({"type": "make", "env_id": "CartPole-v1", "num_envs": 1, "max_episode_steps": -1},
     "invalid_argument", ["max_episode_steps"]),
    ({"type": "make", "env_id": "CartPole-v1", "num_envs": 1, "max_episode_steps": "10"},
     "invalid_argument", ["max_episode_steps"]),
    ({"type": "make", "env_id": "CartPole-v1", "num_envs": 1, "env_kwargs": [1]}, "bad_request",
     ["'env_kwargs'", "map"]),
    ({"type": "make", "env_id": "CartPole-v1", "num_envs": 1, "env_kwargs": "x"}, "bad_request",
     ["'env_kwargs'"]),
    ({"type": "make", "env_id": "CartPole-v1", "num_envs": 1, "env_kwargs": {"gravity": 1}},
     "invalid_argument", ["'gravity'", "sutton_barto_reward"]),
    ({"type": "make", "env_id": "CartPole-v1", "num_envs": 1,
      "env_kwargs": {"sutton_barto_reward": "yes"}}, "invalid_argument", ["sutton_barto_reward"]),
    ({"type": "make", "env_id": "Pendulum-v1", "num_envs": 1, "env_kwargs": {"g": "x"}},
     "invalid_argument", ["'g'"]),
    ({"type": "make", "env_id": "Pendulum-v1", "num_envs": 1, "env_kwargs": {"g": 1e300}},
     "invalid_argument", ["'g'", "range"]),
    ({"type": "make", "env_id": "Pendulum-v1", "num_envs": 1, "env_kwargs": {"g": math.nan}},
     "invalid_argument", ["'g'"]),
    ({"type": "reset", "session": 5}, "bad_request", ["'session'", "str"]),
    ({"type": "reset", "session": b"abc"}, "bad_request", ["'session'"]),
    ({"type": "reset"}, "bad_request", ["missing", "'session'"]),
    ({"type": "reset", "session": "x", "seeds": 1}, "bad_request", ["'seeds'", "bool"]),
    ({"type": "reset", "session": "x", "mask": "yes"}, "bad_request", ["'mask'"]),
    ({"type": "step", "session": 5}, "bad_request", ["'session'", "str"]),
    ({"type": "step", "session": None}, "bad_request", ["'session'"]),
    ({"type": "step", "session": "x", "actions": [1, 0]}, "bad_request", ["'actions'", "map"]),
    ({"type": "close", "session": 1.5}, "bad_request", ["'session'"]),
    ({"type": "close"}, "bad_request", ["missing", "'session'"]),
]


@pytest.mark.parametrize("header, code, words", WRONG_FIELDS,
                         ids=[repr(h)[:70] for h, _, _ in WRONG_FIELDS])
def test_wrong_field_types(victim, raw, header, code, words):
    attacker = raw()
    attacker.error(header, code, *words)
    assert attacker.ok({"type": "status"})["sessions"] >= 2  # no session leaked in or out


def test_extra_unknown_fields(victim, raw):
    attacker = raw()
    session = attacker.make()["session"]
    valid = [{"type": "hello", "version": protocol.PROTOCOL_VERSION}, {"type": "heartbeat"}, {"type": "list_envs"},
             {"type": "status"}, {"type": "make", "env_id": "CartPole-v1", "num_envs": 1},
             {"type": "reset", "session": session}, {"type": "step", "session": session},
             {"type": "close", "session": session}, {"type": "bye"}]
    for header in valid:
        for extra in ({"bogus": 1}, {"Type": "status"}, {"session_id": "x", "zz": None}):
            message = attacker.error({**header, **extra}, "bad_request", "unknown fields")
            assert all(name in message for name in extra)
    # nothing was done: the session was never reset (the reset had an extra field)
    attacker.error({"type": "step", "session": session}, "env_state", "reset")
    attacker.ok({"type": "close", "session": session})


def test_too_many_data_frames(victim, raw):
    attacker = raw()
    session = attacker.make()["session"]
    attacker.ok({"type": "reset", "session": session})
    for header, allowed in [({"type": "hello", "version": protocol.PROTOCOL_VERSION}, 0), ({"type": "status"}, 0),
                            ({"type": "heartbeat"}, 0), ({"type": "list_envs"}, 0),
                            ({"type": "make", "env_id": "CartPole-v1", "num_envs": 1}, 0),
                            ({"type": "reset", "session": session, "inline": True}, 2),
                            ({"type": "close", "session": session}, 0),
                            ({"type": "bye"}, 0),
                            ({"type": "step", "session": session,
                              "actions": {"dtype": "<i8", "shape": [4]}}, 1)]:
        for extra in (1, 5):
            blobs = [bytes(32)] * (allowed + extra)
            attacker.error(header, "bad_request", "data frames", str(allowed + extra),
                           blobs=blobs)
    # a data frame without an actions description, and the other way round
    attacker.error({"type": "step", "session": session}, "bad_request", "'actions'",
                   blobs=[bytes(32)])
    attacker.error({"type": "step", "session": session,
                    "actions": {"dtype": "<i8", "shape": [4]}}, "bad_request", "data frame")
    # data frames a reset takes only with inline (its seeds and mask)
    attacker.error({"type": "reset", "session": session, "mask": True}, "bad_request",
                   "only taken with inline", blobs=[bytes(1)])
    assert attacker.ok({"type": "status"})["sessions"] >= 3  # the session is still there
    attacker.ok({"type": "step", "session": session})
    attacker.ok({"type": "close", "session": session})


# ---- order of requests, versions, unknown names ---------------------------------------------

def test_requests_before_hello(victim, raw):
    attacker = raw(hello=False)
    session = victim.pairs[0][0].session
    for header in ({"type": "status"}, {"type": "list_envs"}, {"type": "heartbeat"},
                   {"type": "make", "env_id": "CartPole-v1", "num_envs": 1},
                   {"type": "reset", "session": session}, {"type": "step", "session": session},
                   {"type": "close", "session": session}, {"type": "bye"}):
        attacker.error(header, "bad_request", "hello", repr(header["type"]))
    # a refused hello does not count
    attacker.error({"type": "hello", "version": protocol.PROTOCOL_VERSION + 1},
                   "unsupported_version")
    attacker.error({"type": "status"}, "bad_request", "hello")
    attacker.hello()
    attacker.ok({"type": "status"})
    # the victim's session was not touched by any of it
    attacker.error({"type": "close", "session": session}, "unknown_session")


@pytest.mark.parametrize("version", [0, 1, 3, 99, -1, 2**63 - 1, -2**63, 2**64 - 1])
def test_hello_with_an_unsupported_version(victim, raw, version):
    attacker = raw(hello=False)
    message = attacker.error({"type": "hello", "version": version}, "unsupported_version",
                             str(protocol.PROTOCOL_VERSION), str(version))
    assert "version" in message
    # an already greeted client asking again for another version is refused too
    greeted = raw()
    greeted.error({"type": "hello", "version": version}, "unsupported_version")
    greeted.ok({"type": "status"})


@pytest.mark.parametrize("env_id", ["NoSuchEnv-v0", "", "cartpole-v1", "CartPole-v1 ",
                                    "CartPole", "../CartPole-v1", "é" * 300])
def test_unknown_env(victim, raw, env_id):
    # a long id is not echoed back in full
    words = [repr(env_id[:20])[:-1]] if len(env_id) <= 100 else [f"{len(env_id)} characters"]
    message = raw().error({"type": "make", "env_id": env_id, "num_envs": 1}, "unknown_env", *words)
    for known in envd.list_envs():
        assert known in message


def test_unknown_session(victim, raw):
    attacker = raw()
    for session in ("nope", "", "0" * 32, "x" * 60_000):
        for kind in ("reset", "step", "close"):
            attacker.error({"type": kind, "session": session}, "unknown_session")
    # a header over --max-header-bytes is refused before it is decoded
    attacker.error({"type": "reset", "session": "x" * 100_000}, "bad_request",
                   "--max-header-bytes")
    # a session that was closed is unknown afterwards
    session = attacker.make()["session"]
    attacker.ok({"type": "close", "session": session})
    for kind in ("reset", "step", "close"):
        attacker.error({"type": kind, "session": session}, "unknown_session", session)
    attacker.error({"type": "heartbeat", "client": b"\x01" + bytes(15)}, "unknown_session")


def test_the_session_of_another_client(victim, raw):
    attacker = raw()
    for remote, _ in victim.pairs:
        for header in ({"type": "step", "session": remote.session},
                       {"type": "reset", "session": remote.session},
                       {"type": "close", "session": remote.session},
                       {"type": "step", "session": remote.session,
                        "actions": {"dtype": "<i8", "shape": [8]}}):
            attacker.error(header, "unknown_session", remote.session,
                           blobs=[bytes(64)] if "actions" in header else ())
    # the victim's sessions were neither stepped, reset nor closed: checked by the fixture


@pytest.mark.parametrize("num_envs", [0, -1, -2**63, 2**20 + 1, 2**40, 2**63 - 1, 2**64 - 1])
def test_invalid_num_envs(victim, raw, num_envs):
    raw().error({"type": "make", "env_id": "CartPole-v1", "num_envs": num_envs},
                "invalid_argument", "num_envs", str(num_envs))


# ---- actions ---------------------------------------------------------------------------------

def test_inline_actions_of_the_wrong_shape_or_dtype(victim, raw):
    attacker = raw()
    reply = attacker.make("CartPole-v1", 4, seed=5)
    session = reply["session"]
    assert reply["shm"]["arrays"]["actions"][1:] == ["<i8", [4]]
    segment = attach(reply)
    attacker.ok({"type": "reset", "session": session})

    def step(description, *blobs):
        return {"type": "step", "session": session, "actions": description}, blobs

    cases = [
        (step({"dtype": "<i4", "shape": [4]}, bytes(16)), "invalid_action", ["'<i8'", "[4]"]),
        (step({"dtype": "<f8", "shape": [4]}, bytes(32)), "invalid_action", ["'<i8'"]),
        (step({"dtype": ">i8", "shape": [4]}, bytes(32)), "invalid_action", ["'<i8'"]),
        (step({"dtype": "int64", "shape": [4]}, bytes(32)), "invalid_action", ["'<i8'"]),
        (step({"dtype": "<i8", "shape": [3]}, bytes(24)), "invalid_action", ["[4]"]),
        (step({"dtype": "<i8", "shape": [4, 1]}, bytes(32)), "invalid_action", ["[4]"]),
        (step({"dtype": "<i8", "shape": []}, bytes(8)), "invalid_action", ["[4]"]),
        (step({"dtype": "<i8", "shape": 4}, bytes(32)), "invalid_action", ["[4]"]),
        (step({"dtype": "<i8", "shape": ["4"]}, bytes(32)), "invalid_action", ["[4]"]),
        (step({"dtype": "<i8", "shape": [4], "order": "F"}, bytes(32)), "invalid_action",
         ["'order'"]),
        (step({"dtype": "<i8"}, bytes(32)), "invalid_action", ["shape"]),
        (step({}, bytes(32)), "invalid_action", ["'<i8'"]),
        (step({"dtype": 8, "shape": None}, bytes(32)), "invalid_action", ["'<i8'"]),
        (step({"dtype": "<i8", "shape": [4]}, bytes(31)), "invalid_action", ["32 bytes", "31"]),
        (step({"dtype": "<i8", "shape": [4]}, bytes(33)), "invalid_action", ["32 bytes", "33"]),
        (step({"dtype": "<i8", "shape": [4]}, b""), "invalid_action", ["32 bytes"]),
        (step({"dtype": "<i8", "shape": [4]}, bytes(1 << 19)), "invalid_action", ["32 bytes"]),
        (step({"dtype": "<i8", "shape": [4]}), "bad_request", ["no data frame"]),
    ]
    with envd.make("CartPole-v1", 4, seed=5) as local:
        local.reset()
        assert segment.arrays["observations"].tobytes() == local._obs.tobytes()
        for (header, blobs), code, words in cases:
            attacker.error(header, code, *words, blobs=blobs)
            assert attacker.ok({"type": "status"})["env_steps"] >= 0
        # nothing was stepped; correct inline actions still work and match in-process
        rng = np.random.default_rng(3)
        for _ in range(30):
            actions = rng.integers(0, 2, 4)
            header, blobs = step({"dtype": "<i8", "shape": [4]}, actions.astype("<i8").tobytes())
            reply = attacker.ok(header, *blobs)
            obs, rewards, terms, truncs, _ = local.step(actions)
            assert segment.arrays["observations"].tobytes() == obs.tobytes()
            assert segment.arrays["rewards"].tobytes() == rewards.tobytes()
            assert reply["num_done"] == int((terms | truncs).sum())
    attacker.ok({"type": "close", "session": session})


def test_box_actions_of_the_wrong_dtype(victim, raw):
    attacker = raw()
    reply = attacker.make("Pendulum-v1", 3)
    session = reply["session"]
    attacker.ok({"type": "reset", "session": session})
    for dtype in ("<f8", "<f2", "<i4", "|u1", "|b1", "<c8", "not a dtype", ""):
        attacker.error({"type": "step", "session": session,
                        "actions": {"dtype": dtype, "shape": [3, 1]}}, "invalid_action",
                       "'<f4'", "[3, 1]", blobs=[bytes(12)])
    attacker.error({"type": "step", "session": session,
                    "actions": {"dtype": "<f4", "shape": [3]}}, "invalid_action", "[3, 1]",
                   blobs=[bytes(12)])
    actions = np.array([[1.0], [-2.5], [np.nan]], "<f4")
    attacker.ok({"type": "step", "session": session,
                 "actions": {"dtype": "<f4", "shape": [3, 1]}}, actions.tobytes())
    attacker.ok({"type": "close", "session": session})


def test_out_of_range_discrete_actions(victim, raw):
    attacker = raw()
    reply = attacker.make("CartPole-v1", 4, seed=9)
    session = reply["session"]
    segment = attach(reply)
    attacker.ok({"type": "reset", "session": session})
    description = {"dtype": "<i8", "shape": [4]}
    with envd.make("CartPole-v1", 4, seed=9) as local:
        local.reset()
        bad = [[0, 1, 2, 0], [-1, 0, 0, 0], [0, 0, 0, 2**63 - 1], [1, 1, 1, -2**63]]
        for actions in bad:
            index = next(i for i, a in enumerate(actions) if a not in (0, 1))
            attacker.error({"type": "step", "session": session, "actions": description},
                           "invalid_action", "out of range", f"env {index}",
                           str(actions[index]), blobs=[np.array(actions, "<i8").tobytes()])
        # through the shared memory instead of a data frame
        segment.arrays["actions"][...] = [0, 0, 5, 0]
        attacker.error({"type": "step", "session": session}, "invalid_action", "out of range",
                       "env 2")
        # a refused step moved no env: valid steps still match the in-process twin
        for i in range(20):
            actions = np.array([i % 2, 1, 0, (i // 3) % 2])
            segment.arrays["actions"][...] = actions
            attacker.ok({"type": "step", "session": session})
            assert segment.arrays["observations"].tobytes() == local.step(actions)[0].tobytes()
    attacker.ok({"type": "close", "session": session})


def test_stepping_before_reset(victim, raw):
    attacker = raw()
    for env_id, dtype, shape, size in (("CartPole-v1", "<i8", [2], 16),
                                       ("Pendulum-v1", "<f4", [2, 1], 8)):
        session = attacker.make(env_id, 2)["session"]
        attacker.error({"type": "step", "session": session}, "env_state", "reset")
        attacker.error({"type": "step", "session": session,
                        "actions": {"dtype": dtype, "shape": shape}}, "env_state", "reset",
                       blobs=[bytes(size)])
        attacker.error({"type": "reset", "session": session, "mask": True}, "invalid_argument",
                       "reset_mask")
        attacker.ok({"type": "reset", "session": session})
        assert attacker.ok({"type": "step", "session": session})["num_done"] == 0
        attacker.ok({"type": "close", "session": session})


def test_a_client_that_does_not_wait_for_replies(victim, raw):
    """Pipelined requests on one session: each gets its reply; a step sent while
    another runs is refused as busy, and a close while a step runs frees the
    session once the step is done."""
    attacker = raw()
    reply = attacker.make("CartPole-v1", 50_000, seed=0)
    session = reply["session"]
    attacker.ok({"type": "reset", "session": session})
    sent = {}
    for kind in ("step", "step", "step", "close", "step"):
        request_id = attacker.next_id()
        sent[request_id] = kind
        attacker.send({"type": kind, "id": request_id, "session": session})
    replies = {}
    for _ in sent:
        reply = attacker.recv()
        replies[reply["id"]] = reply
    assert set(replies) == set(sent)
    ids = sorted(sent)
    assert replies[ids[0]]["ok"] is True  # the first step ran
    for request_id in ids[1:3]:  # ran after the previous one, or refused as busy
        reply = replies[request_id]
        assert reply["ok"] or (reply["code"] == "env_state" and "busy" in reply["message"]), reply
        if not reply["ok"]:
            clean_message(reply["message"])
    assert replies[ids[3]]["ok"] is True  # the close
    assert replies[ids[4]]["code"] == "unknown_session"  # the step after the close
    wait_until(lambda: not any(n.endswith(session) for n in segments_of(victim.daemon.pid)),
               what="the closed session's segment to be removed")


def test_a_header_with_both_str_and_bin_field_names(victim, raw):
    raw().error({"type": "status", "x": 1, b"y": 2}, "bad_request", "field names must be str")


def test_env_kwargs_with_both_str_and_bin_names(victim, raw):
    raw().error({"type": "make", "env_id": "CartPole-v1", "num_envs": 1,
                 "env_kwargs": {"a": 1, b"b": 2}}, "invalid_argument", "'a'")


# ---- limits ------------------------------------------------------------------------------------

def test_limits_exceeded(tmp_path):
    proc = start_daemon(tmp_path / "limited", "--max-sessions", "2", "--max-envs-per-client", "100")
    context = zmq.Context()
    attacker = Raw(context, proc.endpoint)
    victim = None
    try:
        victim = Bystander(proc, envs=(("CartPole-v1", 8, 3),))
        attacker.hello()
        limits = attacker.ok({"type": "status"})["limits"]
        assert (limits["max_sessions"], limits["max_envs_per_client"]) == (2, 100)
        # the envs limit is per client: the victim's 8 envs do not count
        attacker.error({"type": "make", "env_id": "CartPole-v1", "num_envs": 101},
                       "limit_exceeded", "--max-envs-per-client", "100", "101")
        first = attacker.make("CartPole-v1", 100)["session"]
        attacker.error({"type": "make", "env_id": "Pendulum-v1", "num_envs": 1},
                       "limit_exceeded", "--max-sessions", "2")
        attacker.ok({"type": "close", "session": first})
        second = attacker.make("Pendulum-v1", 60)["session"]
        attacker.error({"type": "make", "env_id": "CartPole-v1", "num_envs": 41},
                       "limit_exceeded", "--max-sessions")
        attacker.ok({"type": "close", "session": second})
        # a second attacker gets its own envs budget, not more sessions
        other = Raw(context, proc.endpoint)
        try:
            other.hello()
            third = other.make("Acrobot-v1", 100)["session"]
            attacker.error({"type": "make", "env_id": "CartPole-v1", "num_envs": 1},
                           "limit_exceeded", "--max-sessions")
            other.ok({"type": "close", "session": third})
        finally:
            other.close()
        # a refused make left nothing reserved
        assert attacker.ok({"type": "status"})["sessions"] == 1
        fourth = attacker.make("CartPole-v1", 92)["session"]
        attacker.error({"type": "make", "env_id": "CartPole-v1", "num_envs": 9},
                       "limit_exceeded")
        attacker.ok({"type": "close", "session": fourth})
        victim.check()
    finally:
        if victim is not None:
            victim.close()
        attacker.close()
        context.term()
        stop_daemon(proc)


# ---- clients that misbehave at the transport level ---------------------------------------

def test_a_client_that_steps_and_disconnects(tmp_path):
    proc = start_daemon(tmp_path / "short_lease", "--lease-timeout", "3")
    context = zmq.Context()
    victim = None
    try:
        victim = Bystander(proc, envs=(("CartPole-v1", 8, 4),))
        for num_envs in (4, 100_000):  # a step run inline, and one likely run on the pool
            before = victim.client.status()["env_steps"]
            attacker_context = zmq.Context()
            attacker = Raw(attacker_context, proc.endpoint)
            try:
                attacker.hello()
                session = attacker.make("CartPole-v1", num_envs)["session"]
                attacker.ok({"type": "reset", "session": session})
                for _ in range(2):  # the second may find the session busy
                    attacker.send({"type": "step", "id": attacker.next_id(), "session": session})
            finally:
                # gone without reading a reply; the linger delivers the steps first
                attacker.socket.close(linger=int(DEADLINE * 1000))
                attacker_context.term()
            wait_until(lambda: victim.client.status()["env_steps"] >= before + num_envs,
                       what="the daemon to run the step of the vanished client")
            victim.check()
        # the vanished clients' leases expire and their sessions are freed
        wait_until(lambda: victim.client.status()["sessions"] == 1,
                   what="the sessions of the vanished clients to be freed")
        assert len(segments_of(proc.pid)) == 1
        victim.check()
    finally:
        if victim is not None:
            victim.close()
        context.term()
        stop_daemon(proc)


def _header_of_size(size: int) -> bytes:
    """A status request with padding, exactly size bytes long."""
    pad = size - len(pack({"type": "status", "id": 1, "pad": ""})) - 4
    while len(frame := pack({"type": "status", "id": 1, "pad": "a" * pad})) != size:
        pad += size - len(frame)
    return frame


def test_a_message_bigger_than_the_limit_drops_the_connection(victim, raw):
    attacker = raw()
    # the limits themselves pass: a header of --max-header-bytes, a message
    # of --max-message-bytes (bulk data in a data frame)
    at_limit = _header_of_size(protocol.DEFAULT_MAX_HEADER_BYTES)
    assert len(at_limit) == protocol.DEFAULT_MAX_HEADER_BYTES
    attacker.error(at_limit, "bad_request", "unknown fields", "'pad'")
    status = pack({"type": "status", "id": 8})
    attacker.error(status, "bad_request", "data frames",
                   blobs=(bytes(MAX_MESSAGE_BYTES - len(status)),))
    session = attacker.make()["session"]
    attacker.ok({"type": "reset", "session": session})

    for frames in ([_header_of_size(MAX_MESSAGE_BYTES + 1)],
                   [pack({"type": "step", "id": 9, "session": session,
                          "actions": {"dtype": "<i8", "shape": [4]}}),
                    bytes(MAX_MESSAGE_BYTES + 1)],
                   [pack({"type": "status", "id": 10}), os.urandom(4 * MAX_MESSAGE_BYTES)]):
        big = raw()
        big.monitor = big.socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        big.socket.send_multipart(frames)
        assert big.monitor.poll(DEADLINE * 1000), "the daemon kept the connection"
        assert recv_monitor_message(big.monitor)["event"] == zmq.EVENT_DISCONNECTED
        assert not big.socket.poll(0), "a dropped request got a reply"
        victim.check()
        attacker.ok({"type": "step", "session": session})  # others are unaffected
    attacker.ok({"type": "close", "session": session})


# ---- fuzz ---------------------------------------------------------------------------------------

FIELD_NAMES = ["type", "id", "version", "client_name", "client", "env_id", "num_envs", "seed",
               "autoreset_mode", "max_episode_steps", "env_kwargs", "session", "seeds", "mask",
               "actions", "dtype", "shape", "sutton_barto_reward", "g", "x"]


class Fuzzer:
    """Random values of every msgpack type, and mutations of valid requests."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.session = ""

    def value(self, depth: int = 0) -> Any:
        r = self.rng
        kind = r.choice(["int", "int", "str", "str", "bytes", "list", "map", "none", "float",
                         "bool"] if depth < 3 else ["int", "str", "none", "bool", "float"])
        if kind == "int":
            return r.choice([0, 1, -1, 2, 3, 7, 64, 2**20, 2**20 + 1, 2**31, 2**63 - 1,
                             -2**63, 2**64 - 1, r.randint(-10, 40)])
        if kind == "str":
            return r.choice(["", "x", "CartPole-v1", "Pendulum-v1", "Acrobot-v1", "next_step",
                             "same_step", "disabled", "<i8", "<f4", self.session, *KNOWN_TYPES,
                             "é\u2603\x00", "a" * r.randint(0, 3000)])
        if kind == "bytes":
            return r.randbytes(r.choice([0, 1, 16, 100]))
        if kind == "list":
            return [self.value(depth + 1) for _ in range(r.randint(0, 4))]
        if kind == "map":
            return {r.choice(FIELD_NAMES): self.value(depth + 1) for _ in range(r.randint(0, 4))}
        if kind == "float":
            return r.choice([0.0, 1.5, -2.0, 1e300, -1e-300, math.inf, -math.inf, math.nan])
        if kind == "bool":
            return r.choice([True, False])
        return None

    def valid(self) -> tuple[dict, list[bytes]]:
        r = self.rng
        s = self.session
        header, blobs = r.choice([
            ({"type": "hello", "version": protocol.PROTOCOL_VERSION, "client_name": "fuzz"}, []),
            ({"type": "heartbeat"}, []),
            ({"type": "list_envs"}, []),
            ({"type": "status"}, []),
            ({"type": "make", "env_id": r.choice(envd.list_envs()), "num_envs": r.randint(1, 3),
              "seed": r.choice([None, 1, [4, 5, 6][:1]]), "autoreset_mode": "next_step",
              "max_episode_steps": r.choice([None, 5]), "env_kwargs": {}}, []),
            ({"type": "reset", "session": s, "seeds": r.choice([True, False]), "mask": False}, []),
            ({"type": "step", "session": s}, []),
            ({"type": "step", "session": s, "actions": {"dtype": "<i8", "shape": [2]}},
             [np.array([r.randint(0, 1), r.randint(-1, 2)], "<i8").tobytes()]),
            ({"type": "close", "session": s}, []),
        ])
        return {**header, "id": r.randint(0, 2**32)}, blobs

    def like(self, old: Any) -> Any:
        """A random value of the same msgpack type as old (to get past the type checks)."""
        for _ in range(50):
            value = self.value()
            if type(value) is type(old):
                return value
        return self.value()

    def mutated(self) -> tuple[dict, list[bytes]]:
        r = self.rng
        header, blobs = self.valid()
        for _ in range(r.choice([1, 1, 1, 2, 2, 3])):
            op = r.choice(["same type"] * 4 + ["set"] * 2 + ["new field", "delete", "type",
                                                            "id", "blobs"])
            name = r.choice([n for n in header if n not in ("type", "id")] or ["id"])
            if op == "same type":
                header[name] = self.like(header.get(name))
            elif op == "set":
                header[name] = self.value()
            elif op == "new field":
                header[r.choice(FIELD_NAMES)] = self.value()
            elif op == "delete" and header:
                del header[r.choice(list(header))]
            elif op == "type":
                header["type"] = r.choice([*KNOWN_TYPES, self.value()])
            elif op == "id":
                header["id"] = self.value()
            else:
                blobs = [r.randbytes(r.choice([0, 8, 16, 64])) for _ in range(r.randint(0, 3))]
        return header, blobs


def test_fuzz_mutated_requests(victim, raw):
    fuzzer = Fuzzer(seed=20240601)
    attacker = raw(hello=False)

    def resync():
        """Greet again and make a fresh session (after a close, or a 'bye' that forgot us)."""
        attacker.hello()
        reply = attacker.make("CartPole-v1", 2, seed=1)
        attacker.ok({"type": "reset", "session": reply["session"]})
        fuzzer.session = reply["session"]

    resync()
    internal_errors, outcomes = [], {}
    for _ in range(300):
        header, blobs = fuzzer.mutated()
        attacker.send(header, *blobs)
        reply = attacker.recv()
        assert reply["id"] == _request_id(header), (header, reply)
        key = (header.get("type") if isinstance(header.get("type"), str) else "?", reply["ok"],
               reply.get("code"))
        outcomes[key] = outcomes.get(key, 0) + 1
        if reply["ok"]:
            if header.get("type") == "make":  # keep the envs count down
                attacker.ok({"type": "close", "session": reply["session"]})
            if header.get("type") in ("close", "bye"):
                resync()
        else:
            assert reply["code"] in protocol.ERROR_CODES, (header, reply)
            assert set(reply) <= {"id", "ok", "code", "message", "native_code"}, reply
            clean_message(reply["message"])
            if reply["code"] == "internal":
                internal_errors.append((header, len(blobs), reply["message"]))
            if "hello" in reply["message"] and reply["code"] == "bad_request":
                resync()  # a mutated 'bye' (or similar) made the daemon forget us
    assert not internal_errors, internal_errors[:5]
    # the fuzz reached deep enough: successes and several kinds of errors
    assert any(ok for _, ok, _ in outcomes), outcomes
    assert len({code for _, ok, code in outcomes if not ok}) >= 4, outcomes
    assert victim.daemon.proc.poll() is None
    status = victim.client.status()
    assert status["pid"] == victim.daemon.pid
    attacker.ok({"type": "close", "session": fuzzer.session})
