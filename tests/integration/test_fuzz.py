"""A protocol fuzzer against a live daemon: at least 100,000 generated messages a run.

Hypothesis (derandomized, so every run sends the same messages) draws a
corpus per example; tests/support/fuzz.py expands it into a batch of BATCH
messages of every kind (random bytes, msgpack of random objects, hostile
msgpack, well-formed requests sent out of order, mutated, corrupted or with
wrong data frames, requests naming the bystander's sessions, replays, frames
near and over --max-message-bytes).  They go out pipelined over raw DEALER
connections:

- READERS connections read the replies as they go (at most MAX_IN_FLIGHT
  ahead) and check every one: a msgpack map with "ok" true or false and the
  id of a request sent (nil for a message the daemon could not read), an
  error's code one of protocol.ERROR_CODES (never "internal") and its message
  free of tracebacks; a request for a session of the bystander is refused
  with unknown_session;
- SILENT connections read nothing until the end (the daemon drops the
  replies that no longer fit in their queues); then their replies are checked
  as well;
- a frame over the limit goes out on a throwaway connection, which ZeroMQ
  drops; a new one is opened for each batch.

Meanwhile a bystander client that made envs before the attack keeps stepping
them, bit for bit equal to in-process twins.  Afterwards the daemon is alive,
serves the bystander, logged no traceback, and its threads, open file
descriptors, shared-memory segments and mappings are back at their counts
before the attack, its resident memory within RSS_SLACK of it.
"""
from __future__ import annotations

import collections
import itertools
import math
import os
import random
import time
import traceback
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import zmq
from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from support import fuzz as fh
from support.daemon import DEADLINE, Bystander, rss_bytes, segments_of, start_daemon, stop_daemon, wait_until

from envd import protocol

#: --max-message-bytes of the fuzzed daemon: small, so frames over it are cheap.
LIMIT = 256 << 10
#: The daemon's cap on a header frame (--max-header-bytes' default): a "big"
#: header over it is refused before it is decoded, with a nil id.
HEADER_LIMIT = protocol.DEFAULT_MAX_HEADER_BYTES
#: Messages a run sends at least (ENVD_FUZZ_MESSAGES may ask for more).
TARGET = max(100_000, int(os.environ.get("ENVD_FUZZ_MESSAGES", "0")))
BATCH = 2_000
READERS, SILENT = 4, 2
MAX_IN_FLIGHT = 256
#: How much the daemon's resident memory may have grown (allocators keep freed memory).
RSS_SLACK = 20 << 20
ERROR_FIELDS = {"id", "ok", "code", "message", "native_code"}
#: What the last run did (for a reader of the test's output, and the assertions).
STATS: dict[str, Any] = {}


@dataclass(frozen=True)
class SessionInfo:
    id: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return np.dtype(self.dtype).itemsize * math.prod(self.shape)

    @classmethod
    def of_make_reply(cls, reply: dict) -> SessionInfo:
        _, dtype, shape = reply["shm"]["arrays"]["actions"]
        return cls(reply["session"], dtype, tuple(shape))


#: Session ids the fuzzer names when it has none of the kind a message asks for.
FAKE_SESSIONS = [SessionInfo("0" * 32, "<i8", (4,)), SessionInfo("", "<f4", (2, 1)),
                 SessionInfo("x" * 70, "<i8", (1,))]
#: The sessions a reader keeps: made at setup and again whenever fewer are left.
READER_MAKES = [{"env_id": "CartPole-v1", "num_envs": 4},
                {"env_id": "Pendulum-v1", "num_envs": 2, "seed": 3},
                {"env_id": "CartPole-v1", "num_envs": 8, "batch_size": 4, "seed": [1] * 8}]


def shm_mappings(pid: int) -> int:
    with open(f"/proc/{pid}/maps") as maps:
        return sum("/dev/shm/envd-" in line for line in maps)


def daemon_counts(pid: int) -> dict[str, Any]:
    return {"fds": len(os.listdir(f"/proc/{pid}/fd")),
            "threads": len(os.listdir(f"/proc/{pid}/task")),
            "segments": segments_of(pid), "mappings": shm_mappings(pid)}


def expected_id(frames: list[bytes]) -> int | None:
    """The id the daemon echoes: nil for a message over the limit or a header
    it cannot read or refuses to (decoded as the daemon decodes it)."""
    if sum(map(len, frames)) > LIMIT:
        return None
    try:
        header = protocol.unpack(frames[0], HEADER_LIMIT)
    except protocol.BadRequest:
        return None
    request_id = header.get("id")
    return request_id if type(request_id) is int else None


class Conn:
    """A raw DEALER connection of the fuzzer and what it knows of its requests."""

    def __init__(self, context: zmq.Context, endpoint: str, name: str, reading: bool):
        self.name, self.reading = name, reading
        self.socket = context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.ROUTING_ID, b"\x02" + os.urandom(15))
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.SNDTIMEO, int(DEADLINE * 1000))
        self.socket.connect(endpoint)
        self.pending: collections.Counter = collections.Counter()  # request id -> replies due
        self.in_flight = 0
        self.requests: dict[Any, tuple[Any, list[bytes]]] = {}  # id -> (header, frames)
        self.foreign: collections.Counter = collections.Counter()  # ids of foreign requests
        self.foreign_kind: dict[int, str] = {}
        self.waiting: dict[int, dict | None] = {}  # ids of synchronous calls -> reply
        self.ambiguous: set = set()  # ids of two requests: no foreign check
        self.history: collections.deque = collections.deque(maxlen=64)
        self.sessions: list[SessionInfo] = []    # made by this connection, live or not
        self.live: dict[str, SessionInfo] = {}   # as far as the replies tell

    def close(self) -> None:
        self.socket.close(linger=0)


class Fuzzer:
    def __init__(self, daemon, victim: Bystander):
        self.daemon, self.victim = daemon, victim
        self.context = zmq.Context()
        self.readers = [Conn(self.context, daemon.endpoint, f"reader {i}", True)
                        for i in range(READERS)]
        self.silent = [Conn(self.context, daemon.endpoint, f"silent {i}", False)
                       for i in range(SILENT)]
        self.conns = self.readers + self.silent
        self.bomber: Conn | None = None
        self.bombers = 0
        self.batches = 0
        self.foreign_checked = 0
        self.peak_rss = 0
        self.ids = itertools.count(10**12)  # ids of the fuzzer's own requests: no fuzzed id is one
        self.sent: collections.Counter = collections.Counter()
        self.replies: collections.Counter = collections.Counter()
        self.problems: list[str] = []
        self.failure: str | None = None
        self.bystander = []
        for remote, local in victim.pairs:
            space = local.single_action_space
            shape = (local.num_envs, *space.shape)
            self.bystander.append(SessionInfo(remote.session, np.dtype(space.dtype).str, shape))
        self.peer = victim.client.client_id

    # ---- synchronous requests (setup, between batches, cleanup) ---------------------------
    def call(self, conn: Conn, header: dict, *blobs: bytes) -> dict:
        request_id = next(self.ids)
        header = {**header, "id": request_id}
        frames = [fh.pack_any(header), *blobs]
        conn.socket.send_multipart(frames)
        self._expect(conn, request_id, header, frames, None)
        conn.waiting[request_id] = None
        while conn.waiting[request_id] is None:
            assert self.wait_readable(conn), (
                f"{conn.name}: no reply to {header} within {DEADLINE:g} s; daemon alive: "
                f"{self.daemon.proc.poll() is None}\n{self.daemon.log()[-3000:]}")
            self.read(conn)
        return conn.waiting.pop(request_id)

    def ok(self, conn: Conn, header: dict, *blobs: bytes) -> dict:
        reply = self.call(conn, header, *blobs)
        assert reply["ok"] is True, (conn.name, header, reply)
        return reply

    def resync(self, conn: Conn) -> None:
        """Greet again (a fuzzed bye may have made the daemon forget the
        connection), and keep 2 to 6 live sessions to fuzz."""
        self.ok(conn, {"type": "hello", "version": protocol.PROTOCOL_VERSION})
        said_bye = False
        while len(conn.live) < 2:
            make = READER_MAKES[len(conn.sessions) % len(READER_MAKES)]
            reply = self.call(conn, {"type": "make", **make})
            if not reply["ok"] and reply["code"] == "limit_exceeded" and not said_bye:
                said_bye = True
                # The connection holds sessions the fuzzer lost track of (it
                # forgets one whose close was refused busy, or that a reply to
                # a corrupted request named): bye frees them all, then greet again.
                self.ok(conn, {"type": "bye"})
                self.ok(conn, {"type": "hello", "version": protocol.PROTOCOL_VERSION})
                continue
            assert reply["ok"] is True, (conn.name, make, reply)
            self.ok(conn, {"type": "reset", "session": reply["session"]})
        while len(conn.live) > 6:
            session = next(iter(conn.live))
            reply = self.call(conn, {"type": "close", "session": session})
            # busy: a recv waits; unknown: a close that was fuzzed beyond recognition
            assert reply["ok"] or reply["code"] in ("env_state", "unknown_session"), reply
            conn.live.pop(session, None)

    # ---- building messages ----------------------------------------------------------------
    def session(self, ref: fh.Ref, conn: Conn, salt: int) -> SessionInfo:
        if ref.whose == "other":
            choices = self.bystander
        elif ref.whose == "own":
            choices = list(conn.live.values()) or conn.sessions or FAKE_SESSIONS
        else:
            choices = [s for s in conn.sessions if s.id not in conn.live] or FAKE_SESSIONS
        return choices[(ref.k + salt) % len(choices)]

    def resolve(self, value: Any, conn: Conn, salt: int) -> Any:
        if isinstance(value, fh.Ref):
            return self.session(value, conn, salt).id
        if isinstance(value, fh.Desc):
            session = self.session(value.ref, conn, salt)
            return {"dtype": session.dtype, "shape": list(session.shape)}
        if isinstance(value, fh.Blob):
            session = self.session(value.ref, conn, salt)
            return bytes([value.fill]) * max(0, session.nbytes + value.delta)
        if value is fh.PEER:
            return self.peer
        return value

    def build(self, msg: fh.Msg, conn: Conn) -> tuple[list[bytes], str | None, Any]:
        """The frames of a message, whether it is a foreign request, and its header."""
        kind, body = msg.kind, msg.body
        if kind in ("bytes", "object", "special"):
            return list(body), None, None
        if kind == "replay":
            if conn.history:
                return conn.history[-min(body, len(conn.history))]
            return [fh.pack_any({"type": "status", "id": next(self.ids)})], None, None
        if kind == "big":
            return self.big(msg, conn)
        if kind == "oversized":
            return self.oversized(msg, conn)
        header, blobs = body[0] if kind == "corrupt" else body
        resolved = {name: self.resolve(value, conn, msg.salt)
                    for name, value in header.items() if value is not fh.DROP}
        if "id" not in header:
            resolved["id"] = next(self.ids)
        frames = [fh.pack_any(resolved), *(self.resolve(blob, conn, msg.salt) for blob in blobs)]
        if kind == "corrupt":
            frames[0] = fh.corrupt(frames[0], *body[1:])
        foreign = None
        if kind == "foreign":
            foreign = "heartbeat" if resolved["type"] == "heartbeat" else "refused"
        return frames, foreign, resolved

    def big(self, msg: fh.Msg, conn: Conn) -> tuple[list[bytes], None, dict]:
        """Frames of LIMIT/2 to LIMIT bytes; "split": several of them, together over the limit."""
        variant, fraction = msg.body
        size = LIMIT // 2 + int(fraction * (LIMIT // 2 - 100))
        header = {"type": "status", "id": next(self.ids)}
        if variant == "pad":
            return [fh.pack_any({**header, "pad": "p" * size})], None, header
        if variant == "split":
            return [fh.pack_any(header), bytes(size), bytes(size)], None, header
        session = self.session(fh.Ref("own", 0), conn, msg.salt)
        header = {"type": "step", "id": next(self.ids), "session": session.id,
                  "actions": {"dtype": session.dtype, "shape": list(session.shape)}}
        if variant == "inline":  # an actions frame of the wrong size
            return [fh.pack_any(header), b"\x01" * size], None, header
        return [fh.pack_any(header), bytes(session.nbytes), b"\x01" * size], None, header

    def oversized(self, msg: fh.Msg, conn: Conn) -> tuple[list[bytes], None, None]:
        variant, extra = msg.body
        if variant == "header":
            header = {"type": "status", "id": 1, "pad": "p" * (LIMIT + extra)}
            return [fh.pack_any(header)], None, None
        if variant == "blob":
            header = {"type": "step", "id": 1, "session": self.bystander[0].id,
                      "actions": {"dtype": "<i8", "shape": [8]}}
            return [fh.pack_any(header), bytes(LIMIT + extra)], None, None
        return [fh.pack_any({"type": "status", "id": 1}), bytes(LIMIT + extra)], None, None

    # ---- sending and reading -----------------------------------------------------------------
    def send(self, msg: fh.Msg) -> None:
        conn = self.conns[msg.sock % len(self.conns)]
        frames, foreign, header = self.build(msg, conn)
        if msg.kind == "oversized" or max(map(len, frames)) > LIMIT:
            # ZeroMQ drops the connection of a frame over the limit: a throwaway one
            if self.bomber is None:
                self.bombers += 1
                self.bomber = Conn(self.context, self.daemon.endpoint, f"bomber {self.bombers}",
                                   False)
            self.bomber.socket.send_multipart(frames, copy=False)
            over = "" if msg.kind == "oversized" else " (over the limit)"
            self.sent[msg.kind + over] += 1
            return
        conn.socket.send_multipart(frames, copy=len(frames[-1]) < 65536)
        self.sent[msg.kind] += 1
        conn.history.append((frames, foreign, header))
        if conn.reading:
            request_id = expected_id(frames)
            if isinstance(header, dict) and request_id != header.get("id"):
                # a corrupted id may be one the fuzzer gave another request
                conn.ambiguous.add(request_id)
            self._expect(conn, request_id, header, frames, foreign)
            if conn.in_flight > MAX_IN_FLIGHT:
                self.pump(conn, MAX_IN_FLIGHT // 2)

    def _expect(self, conn: Conn, request_id, header, frames, foreign) -> None:
        conn.pending[request_id] += 1
        conn.in_flight += 1
        conn.requests[request_id] = (header, frames)
        if foreign:
            conn.foreign[request_id] += 1
            conn.foreign_kind[request_id] = foreign

    def wait_readable(self, conn: Conn) -> bool:
        """Whether a reply came within DEADLINE (False at once if the daemon died)."""
        end = time.monotonic() + DEADLINE
        while not conn.socket.poll(1000):
            if time.monotonic() > end or self.daemon.proc.poll() is not None:
                return False
        return True

    def pump(self, conn: Conn, target: int) -> None:
        """Read replies until at most target requests of conn are unanswered."""
        while conn.in_flight > target:
            assert not self.problems, "\n".join(self.problems)
            if not self.wait_readable(conn):
                raise AssertionError(
                    f"{conn.name}: no reply within {DEADLINE:g} s with {conn.in_flight} requests "
                    f"unanswered, e.g. {self.describe(conn, next(iter(+conn.pending)))}; "
                    f"daemon alive: "
                    f"{self.daemon.proc.poll() is None}\n{self.daemon.log()[-3000:]}")
            self.read(conn)

    def read(self, conn: Conn) -> None:
        while True:
            try:
                frames = conn.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.on_reply(conn, frames)

    def describe(self, conn: Conn, request_id) -> str:
        header, frames = conn.requests.get(request_id, (None, []))
        text = repr(header) if header is not None else repr([f[:120] for f in frames[:4]])
        return f"request id {request_id!r}: {text[:400]}"

    def problem(self, conn: Conn, request_id, text: str, reply: Any) -> None:
        if len(self.problems) < 20:
            self.problems.append(f"{conn.name}: {text}: reply {str(reply)[:300]} to "
                                 f"{self.describe(conn, request_id)}")

    def on_reply(self, conn: Conn, frames: list[bytes]) -> None:
        try:
            reply = msgpack.unpackb(frames[0], raw=False)
        except Exception as exc:  # noqa: BLE001 -- msgpack raises several unrelated types
            reply = f"{frames[0][:100]!r} ({type(exc).__name__})"
        request_id = reply.get("id", "?") if isinstance(reply, dict) else "?"
        if (not isinstance(reply, dict) or type(reply.get("ok")) is not bool
                or not (request_id is None or type(request_id) is int)):
            return self.problem(conn, None, "not a reply map with ok and id", reply)
        ok = reply["ok"]
        if conn.pending.get(request_id, 0) > 0:
            conn.pending[request_id] -= 1
            conn.in_flight -= 1
            header = conn.requests[request_id][0]
        elif conn.reading:
            return self.problem(conn, request_id, "a reply to no request (or one reply too many)",
                                reply)
        else:
            header = None  # a silent connection's fuzzed request: not tracked
        self.replies[(ok, reply.get("code"))] += 1
        if ok:
            # data frames: a recv's env ids, and inline arrays (one per name in "arrays")
            arrays = reply.get("arrays", [])
            allowed = 1 + len(arrays) if isinstance(arrays, list) else -1
            if len(frames) - 1 > allowed or (len(frames) >= 2 and not arrays
                                             and len(frames[1]) % 8):
                self.problem(conn, request_id, f"an ok reply with {len(frames) - 1} data frames",
                             reply)
        else:
            message = reply.get("message")
            if (len(frames) != 1 or reply.get("code") not in protocol.ERROR_CODES
                    or not set(reply) <= ERROR_FIELDS):
                self.problem(conn, request_id, "a malformed error reply", reply)
            elif reply["code"] == "internal":
                self.problem(conn, request_id, "an internal error", reply)
            if (not isinstance(message, str) or not message.strip() or "Traceback" in message
                    or 'File "' in message):
                self.problem(conn, request_id, "an error message that is empty or has a traceback",
                             reply)
        if conn.foreign.get(request_id, 0) > 0:
            conn.foreign[request_id] -= 1
            self.foreign_checked += 1
            if request_id in conn.ambiguous:
                pass  # the reply may be the other request's
            elif conn.foreign_kind[request_id] == "heartbeat":  # may name another connection
                if not ok:
                    self.problem(conn, request_id, "a heartbeat for the bystander was refused",
                                 reply)
            elif ok or not (reply["code"] == "unknown_session" or (
                    reply["code"] == "bad_request" and reply["message"].startswith("send hello"))):
                self.problem(conn, request_id, "a request for the bystander's session was not "
                             "refused with unknown_session", reply)
        if request_id in conn.waiting:
            conn.waiting[request_id] = reply
        if conn.pending.get(request_id) == 0:
            del conn.pending[request_id]
            conn.requests.pop(request_id, None)
            conn.foreign.pop(request_id, None)
            conn.foreign_kind.pop(request_id, None)
            conn.ambiguous.discard(request_id)
        self.track(conn, header, reply)

    @staticmethod
    def track(conn: Conn, header: Any, reply: dict) -> None:
        """What a reply tells of the connection's sessions (as far as it can be known)."""
        kind = header.get("type") if isinstance(header, dict) else None
        session = header.get("session") if isinstance(header, dict) else None
        if reply["ok"]:
            if "session" in reply and isinstance(reply.get("shm"), dict):
                info = SessionInfo.of_make_reply(reply)
                conn.sessions = [*conn.sessions[-31:], info]
                conn.live[info.id] = info
            elif kind == "bye":
                conn.live.clear()
            elif kind == "close" and isinstance(session, str):
                conn.live.pop(session, None)
        elif reply["code"] in ("unknown_session", "session_expired") and isinstance(session, str):
            conn.live.pop(session, None)

    # ---- batches ------------------------------------------------------------------------------
    def run_batch(self, messages: list[fh.Msg]) -> None:
        assert self.failure is None, self.failure  # hypothesis reruns a failing example: fail again
        try:
            for conn in self.readers:
                self.resync(conn)
            for msg in messages:
                self.send(msg)
            for conn in self.readers:
                self.pump(conn, 0)
                assert not +conn.pending, (conn.name, dict(conn.pending))
            if self.bomber is not None:
                assert not self.bomber.socket.poll(0), "a message over the limit got a reply"
                self.bomber.close()
                self.bomber = None
            assert not self.problems, "\n".join(self.problems)
            self.batches += 1
            self.peak_rss = max(self.peak_rss, rss_bytes(self.daemon.pid))
            if self.batches % 5 == 0:  # meanwhile, the bystander is served as ever
                self.victim.step_and_compare(1)
        except BaseException:
            self.failure = traceback.format_exc()
            raise

    def post(self, conn: Conn, header: dict, *blobs: bytes) -> None:
        """Send a request of the fuzzer's own without waiting for its reply."""
        header = {**header, "id": next(self.ids)}
        frames = [fh.pack_any(header), *blobs]
        conn.socket.send_multipart(frames)
        self._expect(conn, header["id"], header, frames, None)

    def warm_up(self) -> None:
        """What the daemon starts lazily (both threads of its executor: two
        makes at once), and its caches: before the baseline is taken."""
        for conn in self.readers:
            self.resync(conn)
        for _ in range(3):
            for conn in self.readers:
                for make in READER_MAKES * 2:
                    self.post(conn, {"type": "make", **make})
                self.post(conn, {"type": "list_envs"})
                self.post(conn, {"type": "status"})
            for conn in self.readers:
                self.pump(conn, 0)
                for session in list(conn.live):
                    self.post(conn, {"type": "reset", "session": session})
                    self.post(conn, {"type": "close", "session": session})
                self.pump(conn, 0)
        assert not self.problems, "\n".join(self.problems)

    def leave(self) -> None:
        """Every connection reads what the daemon still has for it, then says
        bye (freeing what it made)."""
        for conn in self.conns:
            if conn.reading:
                self.pump(conn, 0)
            else:  # first empty the queues, where a reply to the bye would find no room
                while conn.socket.poll(500):
                    self.read(conn)
            reply = self.call(conn, {"type": "bye"})
            # a silent connection that filled its reply queue was dropped (SECURITY.md)
            dropped = not conn.reading and reply.get("code") == "connection_lost"
            assert reply["ok"] or reply["message"].startswith("send hello") or dropped, \
                (conn.name, reply)
            assert conn.in_flight == 0, (conn.name, dict(conn.pending))
        assert not self.problems, "\n".join(self.problems)
        for conn in self.conns:
            conn.close()
        if self.bomber is not None:
            self.bomber.close()
        self.context.term()


def open_files(pid: int) -> list[str]:
    """What the process's file descriptors point to (for failure messages)."""
    targets = []
    for fd in sorted(os.listdir(f"/proc/{pid}/fd"), key=int):
        try:
            targets.append(f"{fd}->{os.readlink(f'/proc/{pid}/fd/{fd}')}")
        except OSError:
            pass
    return targets


def settle(value, good, what: str, pid: int | None = None) -> None:
    """Wait until good(value()); on a timeout, say what value() is then (and
    what the daemon's descriptors are, given its pid)."""
    try:
        wait_until(lambda: good(value()), what=what)
    except AssertionError as exc:
        files = f"; its files: {open_files(pid)}" if pid is not None else ""
        raise AssertionError(f"{exc}: it is {value()}{files}") from None


def fuzz(fuzzer: Fuzzer, examples: int) -> None:
    """Send examples batches of BATCH messages, drawn by hypothesis."""
    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              # no shrinking: the daemon's state goes on from one example to the next,
              # so a failing batch does not fail alone; its report names the request
              phases=[Phase.generate], verbosity=Verbosity.quiet, print_blob=False,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.large_base_example, HealthCheck.filter_too_much])
    @given(corpus=fh.CORPUS, pool=fh.VALUE_POOL, seed=fh.SEEDS)
    def fuzz_batch(corpus, pool, seed):
        # the batch number too: hypothesis repeats seeds (it mutates earlier examples)
        rnd = random.Random(f"{seed}/{fuzzer.batches}")
        fuzzer.run_batch(fh.expand(corpus, pool, rnd, BATCH, len(fuzzer.conns)))

    fuzz_batch()


def test_fuzz_the_protocol(tmp_path):
    daemon = start_daemon(tmp_path / "fuzzed", "--max-message-bytes", str(LIMIT),
                          "--max-envs-per-client", "256", "--lease-timeout", "60")
    victim = fuzzer = None
    try:
        victim = Bystander(daemon)
        assert victim.client.status()["lease_timeout"] == 60  # no fuzzer's lease expires
        pid = daemon.pid
        before_warm_up = daemon_counts(pid)
        # Warm up: what the daemon starts lazily (both threads of its executor)
        # and the memory its allocators keep, before the baseline is taken.
        fuzzer = Fuzzer(daemon, victim)
        fuzzer.warm_up()
        fuzz(fuzzer, 3)
        fuzzer.leave()
        settle(lambda: {name: daemon_counts(pid)[name] for name in ("fds", "segments", "mappings")},
               lambda now: now == {name: before_warm_up[name] for name in now},
               f"the warm-up's connections and sessions to go: {before_warm_up}", pid)
        baseline, baseline_rss = daemon_counts(pid), rss_bytes(pid)
        assert len(baseline["segments"]) == len(victim.pairs)

        fuzzer = Fuzzer(daemon, victim)
        for conn in fuzzer.conns:  # each starts greeted, with sessions to fuzz
            fuzzer.resync(conn)
        started = time.monotonic()
        fuzz(fuzzer, math.ceil(TARGET / BATCH) + 2)
        elapsed = time.monotonic() - started
        fuzzer.leave()
        sent = sum(fuzzer.sent.values())
        STATS.update(messages=sent, batches=fuzzer.batches, seconds=round(elapsed, 1),
                     per_second=round(sent / elapsed), kinds=dict(fuzzer.sent),
                     replies={"ok" if ok else code: n for (ok, code), n in fuzzer.replies.items()},
                     foreign_checked=fuzzer.foreign_checked, bombers=fuzzer.bombers,
                     rss_mib={"baseline": baseline_rss >> 20, "peak": fuzzer.peak_rss >> 20})
        fuzzer = None
        print(f"\nprotocol fuzzer: {STATS}")
        assert sent >= TARGET, STATS
        # the fuzz reached deep: successes, and errors of every kind a client can cause
        assert STATS["replies"]["ok"] > sent // 20, STATS
        assert set(STATS["replies"]) >= {
            "bad_request", "unknown_type", "unsupported_version", "unknown_env", "unknown_session",
            "invalid_argument", "invalid_action", "env_state", "limit_exceeded"}, STATS
        assert STATS["foreign_checked"] > sent // 50, STATS

        # afterwards: alive, serving the bystander, back where it was
        assert daemon.proc.poll() is None, daemon.log()[-3000:]
        victim.check()
        wait_until(lambda: victim.client.status()["sessions"] == len(victim.pairs),
                   what="the fuzzers' sessions to be freed")
        wait_until(lambda: victim.client.status()["clients"] == 1,
                   what="the fuzzers' client records to go")
        for name in ("fds", "threads", "segments", "mappings"):
            settle(lambda: daemon_counts(pid)[name], lambda now: now == baseline[name],
                   f"the daemon's {name} to return to {baseline[name]}", pid)
        settle(lambda: rss_bytes(pid) >> 20, lambda now: now < (baseline_rss + RSS_SLACK) >> 20,
               f"the daemon's RSS to return within {RSS_SLACK >> 20} MiB of "
               f"{baseline_rss >> 20} MiB")
        STATS["rss_mib"]["after"] = rss_bytes(pid) >> 20
        print(f"protocol fuzzer: the daemon's RSS in MiB: {STATS['rss_mib']}")
        log = daemon.log()
        assert "Traceback" not in log and "internal error" not in log, log[-5000:]
        victim.check()
    finally:
        if fuzzer is not None:
            for conn in fuzzer.conns:
                conn.close()
            if fuzzer.bomber is not None:
                fuzzer.bomber.close()
            fuzzer.context.term()
        if victim is not None:
            victim.close()
        stop_daemon(daemon)
