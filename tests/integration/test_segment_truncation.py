"""A client truncating its own session segment (issue 15, defect 6).

Any process of the client's uid can ftruncate /dev/shm/envd-... at any moment;
the daemon's next access past the new end would raise SIGBUS and kill it with
every session.  Here a hostile client truncates its segment (to 0 bytes, to
half, or to the header page alone) and then asks for a reset, a step (shm and
inline transports), a fast-path step, send or recv, or a close: the daemon
must live, answer the offender with a clear shared_memory error naming the
truncation, remove the segment, and keep stepping a bystander session
bit-exactly (compared with in-process envd.make).

The offender speaks the protocol by hand (test_bad_input.Raw): the official
client would itself die of SIGBUS reading its own truncated mapping.
"""
from __future__ import annotations

import mmap
import os
import time

import numpy as np
import pytest
import zmq
from support.daemon import DEADLINE, Bystander, DaemonProcess, segments_of, start_daemon, stop_daemon, wait_until
from test_bad_input import Raw

from envd import protocol
from envd.client.doorbell import RECV, SEND, STEP, Doorbell
from envd.errors import SharedMemoryError
from envd.shm import HEADER_SIZE, SHM_DIR, Segment


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    proc = start_daemon(tmp_path_factory.mktemp("truncation"))
    try:
        yield proc
    finally:
        stop_daemon(proc)  # exits 0 and leaves no segment, revoked ones included


@pytest.fixture
def bystander(served):
    b = Bystander(served)
    try:
        yield b
        b.check()  # alive, and bit-exact against envd.make
    finally:
        b.close()


@pytest.fixture
def offender(served):
    context = zmq.Context()
    sock = Raw(context, served.endpoint)
    try:
        sock.hello()
        yield sock
    finally:
        sock.close()
        context.term()


def truncate(reply: dict, size: int) -> None:
    """What the hostile client does: shrink its session's file."""
    path = os.path.join(SHM_DIR, reply["shm"]["name"])
    with open(path, "r+b") as f:
        os.ftruncate(f.fileno(), size)
    assert os.stat(path).st_size == size


def expect_truncated(sock: Raw, header: dict, *blobs: bytes) -> None:
    reply = sock.ask(header, *blobs)
    assert reply["ok"] is False and reply["code"] == "shared_memory", reply
    assert "truncated" in reply["message"] and "make a new env" in reply["message"], reply
    assert isinstance(protocol.error_from_reply(reply), SharedMemoryError)


def check_gone(served, offender: Raw, made: dict) -> None:
    """The session is closed (every later request says why, a close is
    fine), its segment removed."""
    session = made["session"]
    expect_truncated(offender, {"type": "step", "session": session})
    wait_until(lambda: made["shm"]["name"] not in segments_of(served.pid),
               what="the revoked segment to be removed")
    assert served.proc.poll() is None, served.log()
    assert "truncated its shared-memory segment" in served.log()
    offender.ok({"type": "close", "session": session})  # what env.close() sends


NUM_ENVS = 4096
SIZES = {"empty": lambda size: 0, "half": lambda size: size // 2}


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("request_kind", ["reset", "reset_inline", "step", "step_inline"])
def test_truncated_then_socket_request(served, bystander, offender, request_kind, size):
    # Big enough that its arrays span many pages: half of them lie wholly
    # past the new end of file (an access to the page holding the end of
    # file itself reads zeros, no SIGBUS).
    made = offender.make("CartPole-v1", NUM_ENVS, seed=3)
    session = made["session"]
    offender.ok({"type": "reset", "session": session})
    truncate(made, SIZES[size](made["shm"]["size"]))
    if request_kind == "reset":
        expect_truncated(offender, {"type": "reset", "session": session})
    elif request_kind == "reset_inline":
        seeds = np.arange(NUM_ENVS, dtype=np.uint64).tobytes()
        expect_truncated(offender, {"type": "reset", "session": session, "seeds": True,
                                    "inline": True}, seeds)
    elif request_kind == "step":
        expect_truncated(offender, {"type": "step", "session": session})
    else:
        actions = np.ones(NUM_ENVS, np.int64)
        expect_truncated(offender, {"type": "step", "session": session, "inline": True,
                                    "actions": {"dtype": actions.dtype.str, "shape": [NUM_ENVS]}},
                         actions.tobytes())
    bystander.step_and_compare(5)
    check_gone(served, offender, made)


@pytest.mark.parametrize("inline", [False, True])
def test_truncated_then_socket_send_and_recv(served, bystander, offender, inline):
    half = NUM_ENVS // 2
    made = offender.make("CartPole-v1", NUM_ENVS, seed=8, batch_size=half)
    session = made["session"]
    offender.ok({"type": "reset", "session": session})
    truncate(made, 0)
    ids = np.arange(half, dtype=np.int64)
    send = offender.ask({"type": "send", "session": session, "inline": inline}, ids.tobytes(),
                        *([np.zeros(half, np.int64).tobytes()] if inline else []))
    # The send may be refused at once (inline: its actions are written into
    # the segment), else the recv says so.
    if send["ok"]:
        expect_truncated(offender, {"type": "recv", "session": session, "count": half,
                                    "inline": inline})
    else:
        assert send["code"] == "shared_memory", send
    bystander.step_and_compare(5)
    check_gone(served, offender, made)


def wait_closed(bell: Doorbell) -> None:
    """The daemon tells a waiting fast-path client that its session closed
    (no answer comes: the daemon's results went to private memory)."""
    answer = bell.wait(time.monotonic() + DEADLINE, lambda: None)
    assert answer is None and bell.closed


@pytest.mark.parametrize("kind", [STEP, SEND, RECV])
def test_truncated_then_fast_path_request(served, bystander, offender, kind):
    num_envs = 64
    made = offender.make("CartPole-v1", num_envs, seed=4,
                         **({} if kind == STEP else {"batch_size": 16}))
    session = made["session"]
    segment = Segment.attach(made["shm"]["name"], session, made["shm"]["arrays"],
                             made["shm"]["size"], where="test")
    offender.ok({"type": "reset", "session": session})
    doorbell = offender.ok({"type": "fast", "session": session})["doorbell"]
    bell = Doorbell(segment.memory, doorbell["offset"])
    if kind == RECV:  # something to receive, sent before the truncation
        segment.arrays["doorbell_ids"][:16] = np.arange(16)
        bell.ring(SEND, 16)
        assert bell.wait(time.monotonic() + DEADLINE, lambda: None)[0] == 0
    elif kind == SEND:
        segment.arrays["doorbell_ids"][:16] = np.arange(16)
    # Keep the header page (the doorbell), drop every array; from now on
    # this process touches only the header page of its own mapping.
    truncate(made, HEADER_SIZE)
    bell.ring(kind, 16 if kind != STEP else 0)
    wait_closed(bell)
    bystander.step_and_compare(5)
    check_gone(served, offender, made)


def test_truncated_then_closed(served, bystander, offender):
    """Closing a fast-path session writes its doorbell's closed word: into a
    truncated file, that would be a SIGBUS."""
    made = offender.make("CartPole-v1", 8, seed=5)
    session = made["session"]
    offender.ok({"type": "reset", "session": session})
    offender.ok({"type": "fast", "session": session})
    truncate(made, 0)
    offender.ok({"type": "close", "session": session})
    wait_until(lambda: made["shm"]["name"] not in segments_of(served.pid),
               what="the closed segment to be removed")
    bystander.step_and_compare(5)
    assert served.proc.poll() is None, served.log()


def test_truncated_fast_session_closed_on_the_lease_tick(served, bystander, offender):
    """A fast-path session whose client never uses the socket again is closed
    by the daemon's periodic look at revocations, and its client told."""
    made = offender.make("CartPole-v1", 8, seed=6)
    session = made["session"]
    offender.ok({"type": "reset", "session": session})
    doorbell = offender.ok({"type": "fast", "session": session})["doorbell"]
    path = os.path.join(SHM_DIR, made["shm"]["name"])
    truncate(made, HEADER_SIZE)
    with open(path, "r+b") as f:
        header = mmap.mmap(f.fileno(), HEADER_SIZE)
    bell = Doorbell(header, doorbell["offset"])
    bell.ring(STEP)
    wait_closed(bell)
    with served.connect() as client:
        wait_until(lambda: client.status()["sessions"] == len(bystander.pairs),
                   what="the revoked session to be closed")
    check_gone(served, offender, made)


def test_with_pythons_faulthandler_enabled(tmp_path):
    """PYTHONFAULTHANDLER=1 installs faulthandler's SIGBUS handler before the
    guard's: the guard, installed last, still takes the segment's faults (and
    would pass others on to faulthandler)."""
    daemon = DaemonProcess(tmp_path / "daemon", "--threads", "2",
                           env={"PYTHONFAULTHANDLER": "1"})
    context = zmq.Context()
    sock = Raw(context, daemon.endpoint)
    try:
        sock.hello()
        made = sock.make("CartPole-v1", NUM_ENVS, seed=7)
        truncate(made, 0)
        expect_truncated(sock, {"type": "reset", "session": made["session"]})
        assert daemon.proc.poll() is None, daemon.log()
        assert "Fatal Python error" not in daemon.log()
    finally:
        sock.close()
        context.term()
        stop_daemon(daemon)
