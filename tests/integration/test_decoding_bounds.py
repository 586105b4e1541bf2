"""Issue 38 N2: a request's header is bounded before it is decoded.

One 8 MiB header frame of nested empty arrays once took a daemon from 51 to
644 MiB (msgpack allocated a list per byte, before `hello` or any field was
checked).  Now the header frame has its own cap (--max-header-bytes), a
pre-scan bounds its objects and nesting, and a make's per-env lists travel in
data frames, so large makes keep small headers.
"""
from __future__ import annotations

import os

import msgpack
import numpy as np
import zmq
from support.daemon import DEADLINE, Bystander, peak_rss, rss_bytes, wait_until
from test_hostile_load import Stepper
from test_metrics import free_port, scrape, value

import envd
from envd import protocol

MiB = 1 << 20


def nested_empty_arrays(size: int) -> bytes:
    """A msgpack map whose one value is an array of (size - 16) empty arrays:
    size bytes that decode to a Python list per byte."""
    count = size - 16
    return (b"\x83\xa4type\xa5hello\xa2id\x01\xa1x\xdd" + count.to_bytes(4, "big")
            + b"\x90" * count)


def raw_request(endpoint: str, frames: list[bytes]) -> dict:
    """Send frames from a fresh raw DEALER socket; its one reply's header."""
    with zmq.Context() as context, context.socket(zmq.DEALER) as sock:
        sock.setsockopt(zmq.ROUTING_ID, b"\x01" + os.urandom(15))
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, int(DEADLINE * 1000))
        sock.connect(endpoint)
        sock.send_multipart(frames)
        return msgpack.unpackb(sock.recv_multipart()[0], raw=False)


def test_a_header_bomb_is_refused_without_memory_while_a_bystander_steps(harness):
    port = free_port()
    daemon = harness.daemon("--threads", "2", "--lease-timeout", "20",
                            "--metrics-port", str(port))
    bystander = Bystander(daemon)
    stepper = Stepper(bystander)
    try:
        stepper.start()
        wait_until(lambda: stepper.steps > 0 or stepper.error is not None,
                   what="the bystander to step")
        before = peak_rss(daemon.pid)
        bomb = nested_empty_arrays(8 * MiB)
        reply = raw_request(daemon.endpoint, [bomb])
        after = peak_rss(daemon.pid)
        print(f"\ndaemon peak RSS {before / MiB:.0f} MiB -> {after / MiB:.0f} MiB on one "
              f"8 MiB header (now {rss_bytes(daemon.pid) / MiB:.0f} MiB)")
        # the frame itself is held a few times (libzmq, pyzmq's copy): never
        # a list per byte (8 Mi lists are over 500 MiB)
        assert after - before < 64 * MiB, (before, after)
        assert reply["ok"] is False and reply["id"] is None, reply
        # answered as any malformed request
        assert reply["code"] == "bad_request" and "--max-header-bytes" in reply["message"]
        # under the cap, a deep header is refused by the scan, as malformed
        deep = b"\x81\xa1x" + b"\x91" * 40 + b"\x90"
        reply = raw_request(daemon.endpoint, [deep])
        assert reply["code"] == "bad_request" and "deeper than 32" in reply["message"], reply
        wait_until(lambda: stepper.steps > 20 or stepper.error is not None,
                   what="the bystander to step on")
        steps = stepper.finish()
        assert steps > 0
        bystander.check()
        status = bystander.client.status()
        assert status["refused_headers"] == 2
        assert status["limits"]["max_header_bytes"] == protocol.DEFAULT_MAX_HEADER_BYTES
        assert value(scrape(port), "envd_refused_headers_total") == 2
    finally:
        if stepper.is_alive():
            stepper.halt.set()
            stepper.join(DEADLINE)
        bystander.close()


def test_per_env_lists_travel_in_data_frames(harness):
    """A make of 20000 Pendulums with a seed list and a per-env gravity (each over
    64 KiB as msgpack) still works: the lists are data frames, bit-exact."""
    daemon = harness.daemon("--threads", "2")
    client = harness.connect(daemon)
    num_envs = 20000
    rng = np.random.default_rng(5)
    seeds = [int(s) for s in rng.integers(0, 2**63, num_envs)]
    gravity = [float(x) for x in rng.uniform(9.0, 11.0, num_envs)]
    assert len(protocol.pack({"seed": seeds})) > protocol.DEFAULT_MAX_HEADER_BYTES
    remote = client.make("Pendulum-v1", num_envs, seed=seeds, g=gravity)
    local = envd.make("Pendulum-v1", num_envs, seed=seeds, g=gravity)
    try:
        assert remote.reset()[0].tobytes() == local.reset()[0].tobytes()
        actions = rng.uniform(-2, 2, (num_envs, 1)).astype(np.float32)
        for got, want in zip(remote.step(actions)[:4], local.step(actions)[:4]):
            assert got.tobytes() == want.tobytes()
    finally:
        remote.close()
        local.close()
    # a make that names a frame it did not send, or sends one it does not name
    header = {"type": "hello", "version": protocol.PROTOCOL_VERSION}
    with zmq.Context() as context, context.socket(zmq.DEALER) as sock:
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, int(DEADLINE * 1000))
        sock.connect(daemon.endpoint)
        for frames, words in (
                ([{"seed": {"blob": 0, "dtype": "<u8"}}], "not there"),
                ([{}, b"\0" * 8], "no per-env list names"),
                ([{"seed": {"blob": 0, "dtype": "<u8"}}, b"\0" * 7], "whole number"),
                ([{"seed": {"blob": 0, "dtype": "O"}}, b"\0" * 8], "dtype")):
            make = {"type": "make", "id": 2, "env_id": "CartPole-v1", "num_envs": 1,
                    **frames[0]}
            sock.send_multipart([protocol.pack({**header, "id": 1})])
            assert msgpack.unpackb(sock.recv(), raw=False)["ok"]
            sock.send_multipart([protocol.pack(make), *frames[1:]])
            reply = msgpack.unpackb(sock.recv(), raw=False)
            assert reply["code"] == "bad_request" and words in reply["message"], reply
