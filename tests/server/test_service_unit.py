"""The Service driven directly: no daemon process, no socket.

A Service is built over a real NativePool, an executor whose jobs run only when
the test says so (so a reset or a make is "running" for exactly as long as the
test wants, whatever the machine's speed), and a send that records replies.
Requests go in through Service.handle inside an asyncio loop, as the daemon's
event loop calls it; pool events are delivered by calling on_pool_event, as
the daemon's eventfd reader does.  The tests check the replies (every request
answered exactly once) and each session's lifecycle and resource books.
"""
from __future__ import annotations

import asyncio
import os
import secrets
import select
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

import numpy as np
import pytest

from envd import protocol
from envd.native import native_session
from envd.native._envd_native import lib as _lib
from envd.native.native_vec import NativePool
from envd.server.config import Config
from envd.server.lifecycle import State
from envd.server.service import Service
from envd.server.sessions import Session

DEADLINE = 60.0  # generous: a loaded 2-core machine must not make these flaky
ALICE, BOB = b"\x00alice", b"\x00bob"


class GatedExecutor(Executor):
    """Holds every job until run_jobs(): an operation on the executor (make,
    reset, render) runs for exactly as long as a test wants."""

    def __init__(self) -> None:
        self.jobs: list[tuple[Callable[[], Any], Future]] = []

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future: Future = Future()
        self.jobs.append((lambda: fn(*args, **kwargs), future))
        return future

    def run_jobs(self) -> int:
        jobs, self.jobs = self.jobs, []
        for job, future in jobs:
            try:
                future.set_result(job())
            except BaseException as exc:  # noqa: BLE001 (the Service reports it)
                future.set_exception(exc)
        return len(jobs)


class Harness:
    """One Service, its pool, its gated executor and the replies it sent."""

    def __init__(self, threads: int = 1, **config: Any):
        self.loop = asyncio.new_event_loop()
        self.pool = NativePool(threads)
        self.executor = GatedExecutor()
        self.sent: list[tuple[bytes, dict[str, Any]]] = []
        self.drained = 0
        self.next_id = 0
        self.prefix = f"envdunit-{os.getpid()}-{secrets.token_hex(4)}-"
        self.service = Service(Config(bind=("ipc:///nonexistent/envd.sock",), threads=threads,
                                      **config),
                               self.pool, self.executor, self._record, self.prefix)
        self.service.on_drained = self._on_drained

    def _record(self, identity: bytes, reply: dict[str, Any]) -> bool:
        self.sent.append((identity, reply))
        return True

    def _on_drained(self) -> None:
        self.drained += 1

    def in_loop(self, fn: Callable[[], Any]) -> Any:
        """Call fn on the running event loop, then let its callbacks run."""
        async def call() -> Any:
            result = fn()
            for _ in range(3):
                await asyncio.sleep(0)
            return result
        return self.loop.run_until_complete(call())

    # ---- requests and replies -------------------------------------------------------------
    def request(self, identity: bytes, kind: str, *blobs: bytes, **fields: Any) -> int:
        self.next_id += 1
        header = {"type": kind, "id": self.next_id, **fields}
        self.in_loop(lambda: self.service.handle(identity, [protocol.pack(header), *blobs]))
        return self.next_id

    def replies_to(self, identity: bytes, request_id: int) -> list[dict[str, Any]]:
        return [r for i, r in self.sent if i == identity and r["id"] == request_id]

    def answered(self, identity: bytes, request_id: int) -> bool:
        return bool(self.replies_to(identity, request_id))

    def reply(self, identity: bytes, request_id: int) -> dict[str, Any]:
        """The one reply to a request, waiting for the pool if need be."""
        deadline = time.monotonic() + DEADLINE
        while not self.answered(identity, request_id):
            assert time.monotonic() < deadline, f"no reply to request {request_id}"
            self.pool_event()
            time.sleep(0.001)
        [reply] = self.replies_to(identity, request_id)
        return reply

    def call(self, identity: bytes, kind: str, *blobs: bytes, **fields: Any) -> dict[str, Any]:
        """A request and its one reply (running the executor's jobs it needs)."""
        request_id = self.request(identity, kind, *blobs, **fields)
        self.run_jobs()
        return self.reply(identity, request_id)

    def ask(self, identity: bytes, kind: str, *blobs: bytes, **fields: Any) -> dict[str, Any]:
        """A request and its one reply, the executor's jobs left waiting."""
        return self.reply(identity, self.request(identity, kind, *blobs, **fields))

    def pool_event(self) -> None:
        self.in_loop(self.service.on_pool_event)

    def run_jobs(self) -> int:
        return self.in_loop(self.executor.run_jobs)

    # ---- shortcuts ------------------------------------------------------------------------
    def hello(self, identity: bytes) -> None:
        assert self.call(identity, "hello", version=protocol.PROTOCOL_VERSION)["ok"]

    def make(self, identity: bytes, env_id: str = "CartPole-v1", num_envs: int = 8,
             **fields: Any):
        reply = self.call(identity, "make", env_id=env_id, num_envs=num_envs, seed=0, **fields)
        assert reply["ok"], reply
        return self.service.sessions[reply["session"]]

    def assert_each_request_answered_once(self) -> None:
        ids = [(i, r["id"]) for i, r in self.sent]
        assert len(ids) == len(set(ids)), "a request got more than one reply"
        assert all(r["id"] is not None for _, r in self.sent)

    def close(self) -> None:
        self.in_loop(self.service.free_all)
        self.pool.close()
        self.loop.close()


@pytest.fixture
def harness():
    made: list[Harness] = []

    def build(**kwargs: Any) -> Harness:
        made.append(Harness(**kwargs))
        return made[-1]

    yield build
    for h in made:
        h.close()
        left = [n for n in os.listdir("/dev/shm") if n.startswith(h.prefix)]
        assert left == [], f"segments left behind: {left}"


def books_empty(service: Service) -> bool:
    books = service.books
    return (books.reserved_sessions == books.reserved_shm == books.reserved_state == 0
            and books.shm_in_use == books.state_in_use == 0)


def action_frame(session, value: int = 0) -> tuple[dict, bytes]:
    actions = np.full(session.buffers["actions"].shape, value, session.buffers["actions"].dtype)
    return {"dtype": actions.dtype.str, "shape": list(actions.shape)}, actions.tobytes()


def ids_frame(*ids: int) -> bytes:
    return np.array(ids, np.int64).tobytes()


# ---- hello, make and the reservation ------------------------------------------------------
def test_requests_before_hello_are_refused_and_hello_says_the_version(harness):
    h = harness()
    reply = h.call(ALICE, "make", env_id="CartPole-v1", num_envs=2)
    assert not reply["ok"] and "send hello before" in reply["message"]
    reply = h.call(ALICE, "hello", version=protocol.PROTOCOL_VERSION)
    assert reply["ok"] and reply["version"] == protocol.PROTOCOL_VERSION
    h.assert_each_request_answered_once()


def test_a_make_reserves_while_it_runs_and_claims_its_bytes_once_made(harness):
    h = harness()
    h.hello(ALICE)
    request_id = h.request(ALICE, "make", env_id="CartPole-v1", num_envs=8, seed=0)
    books, client = h.service.books, h.service.clients[ALICE]
    assert books.reserved_sessions == 1 and client.reserved_envs == 8
    assert books.reserved_shm > 0 and books.reserved_state > 0 and books.shm_in_use == 0
    assert not h.answered(ALICE, request_id)  # the build has not run yet
    h.run_jobs()
    reply = h.reply(ALICE, request_id)
    assert reply["ok"]
    session = h.service.sessions[reply["session"]]
    assert session.life.state is State.OPEN
    assert books.reserved_sessions == books.reserved_shm == books.reserved_state == 0
    assert client.reserved_envs == client.reserved_sessions == 0
    assert books.shm_in_use == session.segment_bytes and books.state_in_use == session.state_bytes
    assert h.call(ALICE, "close", session=session.id)["ok"]
    assert session.life.state is State.FREED and books_empty(h.service)
    assert not os.path.exists(session.segment.path)


def test_a_make_over_a_limit_is_refused_and_reserves_nothing(harness):
    h = harness(max_sessions=1)
    h.hello(ALICE)
    first = h.request(ALICE, "make", env_id="CartPole-v1", num_envs=4, seed=0)
    # The first make is still running: it counts against --max-sessions already.
    reply = h.ask(ALICE, "make", env_id="CartPole-v1", num_envs=4, seed=0)
    assert reply["code"] == "limit_exceeded" and "--max-sessions" in reply["message"]
    assert h.service.books.reserved_sessions == 1
    h.run_jobs()
    assert h.reply(ALICE, first)["ok"]
    reply = h.call(ALICE, "make", env_id="CartPole-v1", num_envs=4, seed=0)
    assert reply["code"] == "limit_exceeded"
    assert h.service.books.reserved_sessions == 0 and len(h.service.sessions) == 1
    h.assert_each_request_answered_once()


def test_a_make_that_fails_on_the_executor_releases_its_reservation(harness):
    h = harness()
    h.hello(ALICE)
    reply = h.call(ALICE, "make", env_id="CartPole-v1", num_envs=4, seed=0,
                   env_kwargs={"no_such_parameter": 1.0})
    assert not reply["ok"] and "no_such_parameter" in reply["message"]
    assert books_empty(h.service) and not h.service.sessions
    client = h.service.clients[ALICE]
    assert client.reserved_envs == client.reserved_sessions == 0


def test_a_make_whose_client_left_meanwhile_is_discarded(harness):
    h = harness()
    h.hello(ALICE)
    make = h.request(ALICE, "make", env_id="CartPole-v1", num_envs=4, seed=0)
    assert h.call(ALICE, "bye")["ok"]
    h.run_jobs()
    reply = h.reply(ALICE, make)
    assert reply["code"] == "session_expired"
    assert not h.service.sessions and books_empty(h.service)
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(h.prefix)]
    h.assert_each_request_answered_once()


def test_shutdown_frees_a_session_whose_make_was_never_answered(harness):
    h = harness()
    h.hello(ALICE)
    make = h.request(ALICE, "make", env_id="CartPole-v1", num_envs=4, seed=0)
    h.executor.run_jobs()  # built, but its callback never ran (the loop stopped)
    assert [n for n in os.listdir("/dev/shm") if n.startswith(h.prefix)]
    h.in_loop(h.service.free_all)
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(h.prefix)]
    assert make  # (its reply is lost with the daemon: shutdown answers the socket's queue)


# ---- busy sessions and closing ------------------------------------------------------------
def test_a_close_during_a_reset_frees_the_session_when_the_reset_ends(harness):
    h = harness()
    h.hello(ALICE)
    session = h.make(ALICE)
    reset = h.request(ALICE, "reset", session=session.id)
    assert session.life.state is State.BUSY and session.life.operation == "reset"
    description, frame = action_frame(session)
    reply = h.ask(ALICE, "step", frame, session=session.id, actions=description)
    assert reply["code"] == "env_state" and "reset is still running" in reply["message"]
    assert not h.answered(ALICE, reset)
    assert h.ask(ALICE, "close", session=session.id)["ok"]  # answered at once
    assert session.life.state is State.CLOSING and os.path.exists(session.segment.path)
    assert session.id not in h.service.sessions
    h.run_jobs()
    assert h.reply(ALICE, reset)["ok"]  # the reset that ran is still answered
    assert session.life.state is State.FREED and not os.path.exists(session.segment.path)
    assert books_empty(h.service)
    reply = h.call(ALICE, "step", session=session.id)
    assert reply["code"] == "unknown_session"
    h.assert_each_request_answered_once()


def pending_step(h: Harness, session) -> int:
    """A step request left on the pool (not run inline); the vec is forced to
    the pool, and a step that still finished before the check is tried again."""
    session.native.set_chunk(1)
    description, frame = action_frame(session)
    deadline = time.monotonic() + DEADLINE
    while True:
        step = h.request(ALICE, "step", frame, session=session.id, actions=description)
        if not h.answered(ALICE, step):
            return step
        assert h.replies_to(ALICE, step)[0]["ok"]
        assert time.monotonic() < deadline, "every step finished before the daemon looked"


def test_a_step_on_the_pool_is_answered_once_on_its_pool_event(harness):
    h = harness(threads=2)
    h.hello(ALICE)
    session = h.make(ALICE, "ConnectFour-v0", 64, env_kwargs={"depth": 4})
    assert h.call(ALICE, "reset", session=session.id)["ok"]
    step = pending_step(h, session)
    assert session.life.state is State.BUSY and session.life.operation == "step"
    reply = h.reply(ALICE, step)
    assert reply["ok"] and isinstance(reply["num_done"], int)
    assert session.life.state is State.OPEN
    h.pool_event()
    h.pool_event()  # later events find nothing more to answer
    h.assert_each_request_answered_once()
    assert h.service.idle


def test_a_close_during_a_step_on_the_pool_frees_the_session_when_it_ends(harness):
    h = harness(threads=2)
    h.hello(ALICE)
    session = h.make(ALICE, "ConnectFour-v0", 64, env_kwargs={"depth": 4})
    assert h.call(ALICE, "reset", session=session.id)["ok"]
    step = pending_step(h, session)
    assert h.call(ALICE, "close", session=session.id)["ok"]
    assert session.life.state is State.CLOSING and session.native is not None
    assert h.reply(ALICE, step)["ok"]
    assert session.life.state is State.FREED and books_empty(h.service)
    h.assert_each_request_answered_once()
    # Freed: the envs are gone, and a use of them is a bug that says so.
    assert session.native_if_alive is None
    with pytest.raises(RuntimeError, match=f"session {session.id} .* was freed"):
        session.native.counts()


# ---- async send and recv ------------------------------------------------------------------
def test_send_and_recv_return_the_envs_that_were_sent(harness):
    h = harness(threads=2)
    h.hello(ALICE)
    session = h.make(ALICE, "CartPole-v1", 8, batch_size=4)
    assert h.call(ALICE, "reset", session=session.id)["ok"]
    received: list[int] = []
    for ids in ((0, 1, 2, 3), (4, 5, 6, 7)):
        assert h.call(ALICE, "send", ids_frame(*ids), session=session.id)["ok"]
    for _ in range(2):
        reply = h.call(ALICE, "recv", session=session.id, count=4)
        assert reply["ok"], reply
        received += np.frombuffer(reply["_blobs"][0], np.int64).tolist()
    assert sorted(received) == list(range(8))
    reply = h.call(ALICE, "recv", session=session.id, count=1)  # nothing was sent
    assert reply["code"] == "env_state" and "send more first" in reply["message"]
    reply = h.call(ALICE, "send", ids_frame(0, 0), session=session.id)  # a repeated id
    assert not reply["ok"]
    assert h.call(ALICE, "step", session=session.id)["ok"]  # nothing in flight any more
    h.assert_each_request_answered_once()


def test_an_async_reset_drops_the_envs_in_flight_and_makes_every_env_ready(harness):
    """reset with async: true is the session's async_reset, on the executor:
    the batch in flight is waited for and its results dropped, then every
    env is ready, in env order, exactly once."""
    h = harness(threads=2)
    h.hello(ALICE)
    session = h.make(ALICE, "CartPole-v1", 8, batch_size=4)
    assert h.call(ALICE, "reset", session=session.id)["ok"]
    assert h.call(ALICE, "send", ids_frame(5, 1, 6), session=session.id)["ok"]
    reset = h.request(ALICE, "reset", session=session.id, **{"async": True})
    assert session.life.operation == "async_reset" and not h.answered(ALICE, reset)
    h.pool_event()  # (a pool event meanwhile leaves the session to its reset)
    h.run_jobs()
    assert h.reply(ALICE, reset)["ok"]
    assert session.native.counts() == (0, 8)
    received: list[int] = []
    for _ in range(2):
        reply = h.call(ALICE, "recv", session=session.id, count=4)
        assert reply["ok"], reply
        received += np.frombuffer(reply["_blobs"][0], np.int64).tolist()
    assert received == list(range(8))
    reply = h.call(ALICE, "recv", session=session.id, count=1)
    assert reply["code"] == "env_state" and "send more first" in reply["message"]
    reply = h.call(ALICE, "reset", session=session.id, mask=True, **{"async": True})
    assert reply["code"] == "bad_request" and "takes no mask" in reply["message"]
    assert h.call(ALICE, "step", session=session.id)["ok"]  # nothing out any more
    h.assert_each_request_answered_once()


def test_a_parked_recv_is_answered_and_a_close_meanwhile_frees_after_it(harness):
    h = harness(threads=2)
    h.hello(ALICE)
    session = h.make(ALICE, "ConnectFour-v0", 64, batch_size=64, env_kwargs={"depth": 4})
    assert h.call(ALICE, "reset", session=session.id)["ok"]
    session.native.set_chunk(1)
    deadline = time.monotonic() + DEADLINE
    while True:  # until a recv has to wait (its batch not finished when it came)
        assert h.call(ALICE, "send", ids_frame(*range(64)), session=session.id)["ok"]
        recv = h.request(ALICE, "recv", session=session.id, count=64)
        if not h.answered(ALICE, recv):
            break
        assert h.replies_to(ALICE, recv)[0]["ok"]
        assert time.monotonic() < deadline, "every batch finished before the recv came"
    assert session.life.state is State.BUSY and session.life.operation == "recv"
    assert h.call(ALICE, "close", session=session.id)["ok"]
    assert session.life.state is State.CLOSING
    reply = h.reply(ALICE, recv)
    assert reply["ok"] and sorted(np.frombuffer(reply["_blobs"][0], np.int64)) == list(range(64))
    deadline = time.monotonic() + DEADLINE
    while session.life.state is not State.FREED:
        assert time.monotonic() < deadline
        h.pool_event()
    assert books_empty(h.service) and h.service.idle
    h.assert_each_request_answered_once()


def recv_everything(h: Harness, session) -> list[int]:
    """Receive every env sent and not received yet (as many recvs as it takes)."""
    received: list[int] = []
    while sum(session.native.counts()):
        reply = h.call(ALICE, "recv", session=session.id, count=session.num_envs, min=1)
        assert reply["ok"], reply
        received += np.frombuffer(reply["_blobs"][0], np.int64).tolist()
    return received


@pytest.mark.parametrize("least", [64, 1], ids=["count", "min"])
def test_a_parked_recv_whose_batch_ends_right_after_a_look_is_answered_by_the_next_event(
        harness, monkeypatch, least):
    """Regression (a recv never answered, seen in CI under load, when the
    daemon's Python kept the parked recvs): a pool event looks at a parked
    recv and finds too few envs ready; the batch finishes right after that
    look.  The recv must stay parked in the request engine: the batch's own
    event (written after its done flag, so still to come) answers it.  Here
    the look waits for that event, so the interleaving happens every time."""
    h = harness(threads=2)
    h.hello(ALICE)
    session = h.make(ALICE, "ConnectFour-v0", 64, batch_size=64, env_kwargs={"depth": 4})
    assert h.call(ALICE, "reset", session=session.id)["ok"]
    session.native.set_chunk(1)  # on the pool, never inline
    engine = h.service.stepping.engine
    real_poll = engine.poll
    looked_too_early: list[int] = []

    def batch_ends_right_after_the_look():
        done = real_poll()
        if not done and not looked_too_early:
            looked_too_early.append(1)
            assert select.select([h.pool.eventfd()], [], [], DEADLINE)[0], \
                "the batch never finished"
        return done

    deadline = time.monotonic() + DEADLINE
    while True:  # until a pool event looks at the parked recv before its batch ended
        assert h.call(ALICE, "send", ids_frame(*range(64)), session=session.id)["ok"]
        recv = h.request(ALICE, "recv", session=session.id, count=64, min=least)
        if not h.answered(ALICE, recv):
            with monkeypatch.context() as patch:
                patch.setattr(engine, "poll", batch_ends_right_after_the_look)
                h.pool_event()
            if looked_too_early:
                break
        received = np.frombuffer(h.reply(ALICE, recv)["_blobs"][0], np.int64).tolist()
        assert sorted(received + recv_everything(h, session)) == list(range(64))
        assert time.monotonic() < deadline, "every batch finished before its recv was looked at"
    assert not h.answered(ALICE, recv) and session.native.counts() == (0, 64)
    idle_while_parked = h.service.idle
    h.pool_event()  # the batch's own event
    assert h.answered(ALICE, recv), "the parked recv was left out of the pool events"
    assert not idle_while_parked, "a parked recv is work: a drain must wait for it"
    reply = h.reply(ALICE, recv)
    assert reply["ok"] and sorted(np.frombuffer(reply["_blobs"][0], np.int64)) == list(range(64))
    assert session.life.state is State.OPEN and h.service.idle
    h.assert_each_request_answered_once()


def send_leaving_a_batch_on_the_pool(h: Harness, session) -> None:
    """Send every env, again and again, until a send's batch is still on the
    pool when its reply came (the pool may end a batch within microseconds)."""
    deadline = time.monotonic() + DEADLINE
    while True:
        assert h.ask(ALICE, "send", ids_frame(*range(session.num_envs)), session=session.id)["ok"]
        if session.native.counts()[0]:
            return
        assert h.ask(ALICE, "recv", session=session.id, count=session.num_envs)["ok"]
        assert time.monotonic() < deadline, "every batch finished before the send returned"


def test_a_close_with_a_batch_in_flight_frees_the_session_once_it_ends(harness):
    """Closed while its batch is on the pool (no request running), the session
    waits as a settle request in the engine, and the pool event of its batch
    frees it: not before (freeing would wait on the loop), never twice."""
    h = harness(threads=2)
    h.hello(ALICE)
    session = h.make(ALICE, "ConnectFour-v0", 64, batch_size=64, env_kwargs={"depth": 4})
    assert h.call(ALICE, "reset", session=session.id)["ok"]
    session.native.set_chunk(1)
    send_leaving_a_batch_on_the_pool(h, session)
    assert h.call(ALICE, "close", session=session.id)["ok"]
    engine = h.service.stepping.engine
    if session.life.state is State.CLOSING:  # (else the batch ended before the close)
        assert engine.waiting() == 1 and not h.service.idle
    deadline = time.monotonic() + DEADLINE
    while session.life.state is not State.FREED:
        assert time.monotonic() < deadline, "the closed session was never freed"
        h.pool_event()
    assert engine.waiting() == 0 and books_empty(h.service) and h.service.idle
    h.assert_each_request_answered_once()


def test_shutdown_with_a_recv_parked_forgets_it_and_frees_the_session(harness):
    """At shutdown a parked recv's session is freed (waiting for its batch):
    the engine forgets the recv, which nothing answers any more."""
    h = harness(threads=2)
    h.hello(ALICE)
    session = h.make(ALICE, "ConnectFour-v0", 64, batch_size=64, env_kwargs={"depth": 4})
    assert h.call(ALICE, "reset", session=session.id)["ok"]
    session.native.set_chunk(1)
    deadline = time.monotonic() + DEADLINE
    while True:  # until a recv has to wait
        send_leaving_a_batch_on_the_pool(h, session)
        recv = h.request(ALICE, "recv", session=session.id, count=64)
        if not h.answered(ALICE, recv):
            break
        assert time.monotonic() < deadline, "every batch finished before the recv came"
    engine = h.service.stepping.engine
    assert engine.waiting() == 1
    h.in_loop(h.service.free_all)
    assert session.life.state is State.FREED and engine.waiting() == 0
    h.pool_event()  # nothing left to answer, nothing answered twice
    assert not h.answered(ALICE, recv)
    h.assert_each_request_answered_once()


# ---- leases, drain, other clients ---------------------------------------------------------
def test_lease_expiry_frees_the_sessions_and_later_requests_hear_expired(harness):
    h = harness(lease_timeout=5.0)
    h.hello(ALICE)
    h.hello(BOB)
    alice, bob = h.make(ALICE), h.make(BOB)
    h.service.clients[ALICE].last_seen -= 10.0  # silent for two leases
    h.in_loop(h.service.expire_silent_clients)
    assert alice.life.state is State.FREED and not os.path.exists(alice.segment.path)
    assert bob.life.state is State.OPEN and bob.id in h.service.sessions
    assert h.service.lease_expiries == 1 and h.service.lease_expired_sessions == 1
    reply = h.call(ALICE, "reset", session=alice.id)
    assert reply["code"] == "session_expired"
    assert h.call(ALICE, "close", session=alice.id)["ok"]  # closing it again: fine
    reply = h.call(BOB, "reset", session=bob.id)  # the other client goes on
    assert reply["ok"], reply
    reply = h.call(BOB, "step", session=secrets.token_hex(16))
    assert reply["code"] == "unknown_session"
    h.assert_each_request_answered_once()


def test_a_drain_waits_for_the_running_reset_and_refuses_new_work(harness):
    h = harness()
    h.hello(ALICE)
    session = h.make(ALICE)
    reset = h.request(ALICE, "reset", session=session.id)
    h.in_loop(h.service.start_draining)
    assert h.drained == 0  # the reset still runs
    reply = h.ask(ALICE, "make", env_id="CartPole-v1", num_envs=2, seed=0)
    assert reply["code"] == "shutting_down"
    assert h.ask(ALICE, "status")["ok"]  # still served
    h.run_jobs()
    assert h.reply(ALICE, reset)["ok"]
    assert h.drained >= 1 and h.service.idle
    h.assert_each_request_answered_once()


def test_bye_frees_every_session_of_the_client_only(harness):
    h = harness()
    h.hello(ALICE)
    h.hello(BOB)
    mine = [h.make(ALICE), h.make(ALICE)]
    theirs = h.make(BOB)
    assert h.call(ALICE, "bye")["ok"]
    assert all(s.life.state is State.FREED for s in mine)
    assert theirs.life.state is State.OPEN
    assert h.service.books.shm_in_use == theirs.segment_bytes
    reply = h.call(ALICE, "status")
    assert "send hello before" in reply["message"]
    h.assert_each_request_answered_once()


def test_a_segment_truncated_during_a_reset_closes_the_session_when_the_reset_ends(harness):
    """The reset writes into a segment a client truncated meanwhile: the guard
    gives the daemon private zero pages (no SIGBUS), the reply says why, the
    session closes through its lifecycle (BUSY -> CLOSING -> FREED) and the
    other client's session goes on."""
    h = harness()
    h.hello(ALICE)
    h.hello(BOB)
    session, other = h.make(ALICE), h.make(BOB)
    reset = h.request(ALICE, "reset", session=session.id)
    with open(session.segment.path, "r+b") as segment:
        os.ftruncate(segment.fileno(), 0)
    h.run_jobs()
    reply = h.reply(ALICE, reset)
    assert not reply["ok"] and "truncated" in reply["message"], reply
    assert session.life.state is State.FREED and session.id not in h.service.sessions
    reply = h.call(ALICE, "step", session=session.id)
    assert "truncated" in reply["message"]  # told why, not "unknown session"
    assert h.call(BOB, "reset", session=other.id)["ok"]
    assert h.service.books.shm_in_use == other.segment_bytes
    h.assert_each_request_answered_once()


def test_status_counts_envs_of_batches_that_finished_but_were_not_collected(harness):
    """A batch that finished while nobody looked (no recv, no pool event
    handled yet) is counted by status all the same: status collects first."""
    h = harness(threads=2)
    h.hello(ALICE)
    session = h.make(ALICE, "ConnectFour-v0", 64, batch_size=64, env_kwargs={"depth": 4})
    assert h.call(ALICE, "reset", session=session.id)["ok"]
    session.native.set_chunk(1)
    before = h.service.env_steps
    deadline = time.monotonic() + DEADLINE
    while True:  # until a send leaves its batch on the pool
        if select.select([h.pool.eventfd()], [], [], 0)[0]:
            os.read(h.pool.eventfd(), 8)  # an earlier batch's event: not this one's
        assert h.ask(ALICE, "send", ids_frame(*range(64)), session=session.id)["ok"]
        if session.native.counts()[0]:
            break
        assert h.ask(ALICE, "recv", session=session.id, count=64)["ok"]
        before = h.service.env_steps
        assert time.monotonic() < deadline, "every batch finished before the send returned"
    assert select.select([h.pool.eventfd()], [], [], DEADLINE)[0], "the batch never finished"
    assert h.in_loop(h.service.status)["env_steps"] - before == 64


def test_pool_events_never_wait_for_a_lock_a_reset_on_the_executor_holds(harness):
    """A batch finished, then a reset started on the executor, which holds the
    session's lock while it runs: the pool event of that batch must not wait
    for the lock (the event loop would stall every client for the reset's
    length).  The request engine looks only at sessions with a request
    waiting, and a session running a reset has none."""
    import threading
    h = harness(threads=2)
    h.hello(ALICE)
    session = h.make(ALICE, "CartPole-v1", 8, batch_size=4)
    assert h.call(ALICE, "reset", session=session.id)["ok"]
    assert h.call(ALICE, "send", ids_frame(0, 1, 2, 3), session=session.id)["ok"]
    stepping = h.service.stepping
    reset = h.request(ALICE, "reset", session=session.id)  # waits on the gated executor
    held, release = threading.Event(), threading.Event()

    def hold_the_lock() -> None:  # what the reset does on the executor while it runs
        session.native.lock()
        held.set()
        release.wait(4 * DEADLINE)  # (set by the test: longer than its own wait)
        session.native.unlock()

    holder = threading.Thread(target=hold_the_lock)
    holder.start()
    try:
        assert held.wait(DEADLINE)
        event = threading.Thread(target=h.pool_event)
        event.start()
        event.join(DEADLINE)
        assert not event.is_alive(), "the pool event waited for the reset's lock"
    finally:
        release.set()
        holder.join(DEADLINE)
    h.run_jobs()
    assert h.reply(ALICE, reset)["ok"]
    assert not stepping.engine.waiting() and stepping.idle
    h.assert_each_request_answered_once()


def test_a_bug_while_opening_a_made_session_still_answers_and_frees_it(harness, monkeypatch):
    """An internal error after the build (here: describing the new session
    raises, as a hosted session lacking a field once did) answers the make
    with an internal error instead of leaving its client waiting forever, frees
    the session and releases the reservation: the next make succeeds."""
    h = harness(threads=2)
    h.hello(ALICE)

    def broken(self):
        raise AttributeError("a bug")

    with monkeypatch.context() as patch:
        patch.setattr(Session, "describe", broken)
        reply = h.call(ALICE, "make", env_id="CartPole-v1", num_envs=8, seed=0)
    assert not reply["ok"] and reply["code"] == "internal", reply
    assert h.service.sessions == {}
    assert h.in_loop(h.service.status)["envs"] == 0
    h.make(ALICE, "CartPole-v1", 8)  # nothing reserved is left behind
    h.assert_each_request_answered_once()


def test_a_bug_while_answering_a_completion_still_answers_it_and_the_others(
        harness, monkeypatch):
    """The engine hands each completion over once: a reply that fails to be
    built (a bug, not an env's error) is answered with an internal error and
    frees the session's turn, and the completions polled with it are still
    answered."""
    from envd.server.stepping import SteppingHandlers

    h = harness(threads=2)
    h.hello(ALICE)
    broken_session = h.make(ALICE, "ConnectFour-v0", 64, env_kwargs={"depth": 4})
    other = h.make(ALICE, "ConnectFour-v0", 64, env_kwargs={"depth": 4})
    for session in (broken_session, other):
        assert h.call(ALICE, "reset", session=session.id)["ok"]
    original = SteppingHandlers._step_reply

    def step_reply(self, waiting, done):
        if waiting.session is broken_session:
            raise AttributeError("a bug")
        return original(self, waiting, done)

    # Both steps wait in the engine first (a step answered at once is
    # answered outside the poll); the test's pool events then poll both.
    steps = [pending_step(h, session) for session in (broken_session, other)]
    monkeypatch.setattr(SteppingHandlers, "_step_reply", step_reply)
    broken, answered = (h.reply(ALICE, step) for step in steps)
    assert not broken["ok"] and broken["code"] == "internal", broken
    assert answered["ok"], answered
    assert broken_session.life.state is other.life.state is State.OPEN
    monkeypatch.undo()
    assert h.reply(ALICE, pending_step(h, broken_session))["ok"]  # its turn was freed
    h.assert_each_request_answered_once()


class _LiveIndexElsewhere:
    """native_session's lib, except that the session's live error index
    names env 7: as when a batch of another env failed after the engine
    recorded a completion, before its reply was made."""

    def __getattr__(self, name: str) -> Any:
        return getattr(_lib, name)

    @staticmethod
    def envd_session_error_index(handle: Any) -> int:
        return 7


def test_an_error_reply_names_the_env_of_its_completion_not_the_live_index(harness,
                                                                         monkeypatch):
    """The env an error names comes from the engine's completion record
    (taken under the session's lock), never from the session read later."""
    h = harness(threads=2)
    h.hello(ALICE)
    session = h.make(ALICE, "CartPole-v1", 8, batch_size=4)
    assert h.call(ALICE, "reset", session=session.id)["ok"]
    description, blob = action_frame(session)
    actions = np.frombuffer(blob, session.buffers["actions"].dtype).copy()
    actions[5] = 9  # (CartPole takes 0 or 1)
    monkeypatch.setattr(native_session, "lib", _LiveIndexElsewhere())
    reply = h.call(ALICE, "step", actions.tobytes(), session=session.id, actions=description)
    assert reply["code"] == "invalid_action" and "env 5" in reply["message"], reply
    assert "env 7" not in reply["message"]
    reply = h.call(ALICE, "recv", session=session.id, count=1)  # nothing sent: no env named
    assert reply["code"] == "env_state" and "send more first" in reply["message"], reply
    assert h.call(ALICE, "send", ids_frame(0, 1), session=session.id)["ok"]
    reply = h.call(ALICE, "send", ids_frame(1), session=session.id)  # env 1 is out already
    assert not reply["ok"] and "env 1" in reply["message"] and "env 7" not in reply["message"]
    h.assert_each_request_answered_once()
