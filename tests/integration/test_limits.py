"""The daemon's resource limits against a real daemon: sessions per client,
shared memory over all sessions, and requests per second per client.

Each limit refuses with ``limit_exceeded`` (``envd.LimitExceededError``) and a
message naming the flag and the numbers; the refused client and a bystander
client both keep working, the bystander's results equal bit for bit to
in-process twins.  Timing is never asserted tightly: a loaded 2-core machine
is slow, so waits poll with generous deadlines.
"""
from __future__ import annotations

import os
import time

import msgpack
import numpy as np
import pytest
import zmq
from gymnasium.vector import AutoresetMode
from support.daemon import DEADLINE, Bystander, segments_of, start_daemon, stop_daemon, wait_until

import envd
from envd import protocol
from envd.native.registry import get_spec
from envd.server.config import Config
from envd.server.sessions import segment_plan


def segment_bytes(env_id: str, num_envs: int, mode: str = "next_step") -> int:
    """The size the daemon's segment of such a make has (the daemon's own function)."""
    modes = {"next_step": AutoresetMode.NEXT_STEP, "same_step": AutoresetMode.SAME_STEP}
    return segment_plan(get_spec(env_id), num_envs, modes[mode])[1]


class Raw:
    """A raw DEALER socket speaking the protocol by hand; requests may be
    pipelined (send several, then read their replies by id)."""

    def __init__(self, context: zmq.Context, endpoint: str):
        self.socket = context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.ROUTING_ID, b"\x02" + os.urandom(15))
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(endpoint)
        self._next_id = 0

    def close(self) -> None:
        self.socket.close(linger=0)

    def post(self, header: dict) -> int:
        """Send a request without waiting; its id."""
        self._next_id += 1
        self.socket.send(msgpack.packb({**header, "id": self._next_id}, use_bin_type=True))
        return self._next_id

    def replies(self, count: int) -> dict[int, dict]:
        """The next count replies, by request id."""
        got = {}
        for _ in range(count):
            assert self.socket.poll(DEADLINE * 1000), f"no reply within {DEADLINE:g} s"
            reply = msgpack.unpackb(self.socket.recv(), raw=False)
            assert isinstance(reply, dict) and isinstance(reply.get("ok"), bool), reply
            got[reply["id"]] = reply
        return got

    def ask(self, header: dict) -> dict:
        request_id = self.post(header)
        reply = self.replies(1)
        assert list(reply) == [request_id], reply
        return reply[request_id]

    def ok(self, header: dict) -> dict:
        reply = self.ask(header)
        assert reply["ok"] is True, reply
        return reply

    def error(self, header: dict, *words: str) -> str:
        return refused(self.ask(header), *words)

    def hello(self) -> dict:
        return self.ok({"type": "hello", "version": protocol.PROTOCOL_VERSION,
                        "client_name": "limits test"})

    def make(self, env_id: str = "CartPole-v1", num_envs: int = 4, **fields) -> dict:
        return self.ok({"type": "make", "env_id": env_id, "num_envs": num_envs, **fields})


def refused(reply: dict, *words: str) -> str:
    """reply is a limit_exceeded refusal whose message has these words."""
    assert reply["ok"] is False, reply
    assert reply["code"] == "limit_exceeded", reply
    assert protocol.ERROR_CODES["limit_exceeded"] is envd.LimitExceededError
    message = reply["message"]
    assert "Traceback" not in message, message
    for word in words:
        assert word in message, reply
    return message


# ---- defaults ----------------------------------------------------------------------------

def test_the_default_limits_are_reported_and_shm_is_accounted(daemon):
    defaults = Config()
    with daemon.connect() as client:
        status = client.status()
        limits = status["limits"]
        assert limits == client.server_info["limits"]  # hello and status agree
        assert limits["max_sessions_per_client"] == 256
        shm = os.statvfs("/dev/shm")
        assert limits["max_shm_bytes"] == shm.f_blocks * shm.f_frsize // 2 == defaults.max_shm_bytes
        assert limits["max_requests_per_second"] == 100_000
        assert limits["request_burst"] == 100_000
        assert (limits["max_sessions"], limits["max_envs_per_client"],
                limits["max_message_bytes"]) == (1024, 1 << 20, 64 << 20)
        assert status["shm_bytes"] == 0
        env = client.make("CartPole-v1", 100, seed=1)
        other = client.make("Pendulum-v1", 3, seed=1, autoreset_mode="same_step")
        expected = segment_bytes("CartPole-v1", 100) + segment_bytes("Pendulum-v1", 3, "same_step")
        assert client.status()["shm_bytes"] == expected
        env.reset()
        env.step(np.zeros(100, np.int64))
        env.close()
        wait_until(lambda: client.status()["shm_bytes"] == segment_bytes("Pendulum-v1", 3, "same_step"),
                   what="the closed session's bytes to return")
        other.close()
        wait_until(lambda: client.status()["shm_bytes"] == 0, what="shm_bytes to return to 0")


# ---- --max-sessions-per-client -----------------------------------------------------------

def test_max_sessions_per_client(tmp_path):
    proc = start_daemon(tmp_path / "per_client", "--max-sessions-per-client", "2",
                        "--max-sessions", "64")
    context = zmq.Context()
    attacker, other, bystander = Raw(context, proc.endpoint), Raw(context, proc.endpoint), None
    try:
        bystander = Bystander(proc)  # two sessions: at its own limit, not the others'
        assert attacker.hello()["limits"]["max_sessions_per_client"] == 2
        first = attacker.make()["session"]
        second = attacker.make("Pendulum-v1", 2)["session"]
        attacker.error({"type": "make", "env_id": "Acrobot-v1", "num_envs": 1},
                       "--max-sessions-per-client", "2")
        # a refused make left nothing behind, and the client keeps working
        status = attacker.ok({"type": "status"})
        assert (status["sessions"], status["clients"]) == (4, 2)
        attacker.ok({"type": "close", "session": first})
        third = attacker.make("Acrobot-v1", 3)["session"]
        attacker.ok({"type": "close", "session": third})
        # makes in flight count: of two pipelined makes with one slot free, one is refused
        ids = [attacker.post({"type": "make", "env_id": "CartPole-v1", "num_envs": 5})
               for _ in range(2)]
        replies = attacker.replies(2)
        assert sorted(reply["ok"] for reply in replies.values()) == [False, True], replies
        made = next(reply for reply in replies.values() if reply["ok"])["session"]
        refused(next(reply for reply in replies.values() if not reply["ok"]),
                "--max-sessions-per-client")
        assert set(replies) == set(ids)
        # the limit is per connection: another one gets its own two
        other.hello()
        for _ in range(2):
            other.make("MountainCar-v0", 2)
        other.error({"type": "make", "env_id": "MountainCar-v0", "num_envs": 2},
                    "--max-sessions-per-client")
        # through the client library: the same class and message
        with proc.connect() as client:
            envs = [client.make("CartPole-v1", 2, seed=3) for _ in range(2)]
            with pytest.raises(envd.LimitExceededError, match="--max-sessions-per-client"):
                client.make("CartPole-v1", 2)
            for env in envs:
                env.reset(seed=3)
            envs[0].close()
            client.make("CartPole-v1", 2).close()
        other.ok({"type": "bye"})
        for session in (second, made):
            attacker.ok({"type": "close", "session": session})
        bystander.check()
        wait_until(lambda: attacker.ok({"type": "status"})["sessions"] == 2,
                   what="only the bystander's sessions to remain")
    finally:
        if bystander is not None:
            bystander.close()
        attacker.close()
        other.close()
        context.term()
        stop_daemon(proc)


# ---- --max-shm-bytes ---------------------------------------------------------------------

def test_max_shm_bytes(tmp_path):
    base = segment_bytes("CartPole-v1", 8) + segment_bytes("Pendulum-v1", 4)  # the bystander's
    size = segment_bytes("CartPole-v1", 1000)
    size_same = segment_bytes("CartPole-v1", 1000, "same_step")
    assert size_same > size  # same_step mode adds final_observations
    # room for the bystander, one session of `size`, then one more of `size`
    # but not of `size_same`, then less than `size`
    limit = base + size + size + (size_same - size) // 2
    proc = start_daemon(tmp_path / "shm", "--max-shm-bytes", str(limit),
                        "--max-requests-per-second", "0")
    context = zmq.Context()
    attacker, bystander = Raw(context, proc.endpoint), None
    try:
        bystander = Bystander(proc)
        hello = attacker.hello()
        assert hello["limits"]["max_shm_bytes"] == limit
        assert (hello["limits"]["max_requests_per_second"], hello["limits"]["request_burst"]) == (0, 0)
        assert attacker.ok({"type": "status"})["shm_bytes"] == base
        first = attacker.make("CartPole-v1", 1000)
        assert first["shm"]["size"] == size  # the daemon sized it with the same function
        assert attacker.ok({"type": "status"})["shm_bytes"] == base + size
        segments = segments_of(proc.pid)
        assert len(segments) == 3
        # the mode changes the layout, and the check uses the session's layout
        attacker.error({"type": "make", "env_id": "CartPole-v1", "num_envs": 1000,
                        "autoreset_mode": "same_step"},
                       "--max-shm-bytes", str(limit), str(size_same), str(base + size))
        second = attacker.make("CartPole-v1", 1000)["session"]
        attacker.error({"type": "make", "env_id": "CartPole-v1", "num_envs": 1000},
                       "--max-shm-bytes", str(limit), str(size))
        # one make alone over the limit: refused before any segment exists
        before = segments_of(proc.pid)
        message = attacker.error({"type": "make", "env_id": "CartPole-v1", "num_envs": 1_000_000},
                                 "--max-shm-bytes", str(limit),
                                 str(segment_bytes("CartPole-v1", 1_000_000)))
        assert "1000000 CartPole-v1 envs" in message
        assert segments_of(proc.pid) == before
        # makes in flight count: two pipelined makes with room for one
        attacker.ok({"type": "close", "session": second})
        wait_until(lambda: attacker.ok({"type": "status"})["shm_bytes"] == base + size,
                   what="the closed session's bytes to return")
        ids = [attacker.post({"type": "make", "env_id": "CartPole-v1", "num_envs": 1000})
               for _ in range(2)]
        replies = attacker.replies(2)
        assert set(replies) == set(ids)
        assert sorted(reply["ok"] for reply in replies.values()) == [False, True], replies
        refused(next(reply for reply in replies.values() if not reply["ok"]), "--max-shm-bytes")
        made = next(reply for reply in replies.values() if reply["ok"])["session"]
        assert attacker.ok({"type": "status"})["shm_bytes"] == base + 2 * size
        # through the client library: the same class, and the client keeps working
        with proc.connect() as client:
            with pytest.raises(envd.LimitExceededError, match="--max-shm-bytes"):
                client.make("CartPole-v1", 1000)
            small = client.make("CartPole-v1", 1, seed=4)  # what is left still fits
            small.reset()
            assert client.status()["shm_bytes"] == base + 2 * size + segment_bytes("CartPole-v1", 1)
        # the client left (bye): its session's bytes came back
        wait_until(lambda: attacker.ok({"type": "status"})["shm_bytes"] == base + 2 * size,
                   what="the departed client's bytes to return")
        bystander.check()
        # an unthrottled daemon (--max-requests-per-second 0) takes a flood
        flood = [attacker.post({"type": "status"}) for _ in range(300)]
        assert all(reply["ok"] for reply in attacker.replies(len(flood)).values())
        # everything closed: the accounting is back to zero
        attacker.ok({"type": "close", "session": first["session"]})
        attacker.ok({"type": "close", "session": made})
        wait_until(lambda: attacker.ok({"type": "status"})["shm_bytes"] == base,
                   what="the attacker's bytes to return")
        bystander.check()
        bystander.close()
        bystander = None
        wait_until(lambda: attacker.ok({"type": "status"})["shm_bytes"] == 0,
                   what="shm_bytes to return to 0")
        assert segments_of(proc.pid) == []
    finally:
        if bystander is not None:
            bystander.close()
        attacker.close()
        context.term()
        stop_daemon(proc)


# ---- --max-requests-per-second -----------------------------------------------------------

def test_max_requests_per_second(tmp_path, monkeypatch):
    # Socket path only: the limit throttles requests over the socket, which fast-path steps never use.
    monkeypatch.setenv("ENVD_FAST_PATH", "0")
    # A low rate: the 200 makes below overflow the burst unless the daemon
    # took 20 s to serve them (the bucket refills at the rate meanwhile),
    # and the bound checked is computed from the time they really took.
    rate, burst = 5, 100
    # (a queue of operations long enough that only the rate refuses makes)
    proc = start_daemon(tmp_path / "rate", "--max-requests-per-second", str(rate),
                        "--max-queued-ops", "256")
    context = zmq.Context()
    attacker, bystander = Raw(context, proc.endpoint), None
    try:
        bystander = Bystander(proc, envs=(("CartPole-v1", 8, 11),))
        limits = attacker.hello()["limits"]
        assert (limits["max_requests_per_second"], limits["request_burst"]) == (rate, burst)
        flood_started = time.monotonic()  # the bucket is full (burst) at most from here
        kept = attacker.make("CartPole-v1", 2)["session"]
        # 200 makes back to back, heartbeats among them: the burst goes through,
        # then makes are refused, heartbeats never
        makes, heartbeats = [], []
        for i in range(200):
            makes.append(attacker.post({"type": "make", "env_id": "CartPole-v1", "num_envs": 1}))
            if i % 10 == 0:
                heartbeats.append(attacker.post({"type": "heartbeat"}))
        replies = attacker.replies(len(makes) + len(heartbeats))
        flood_s = time.monotonic() - flood_started
        assert all(replies[i]["ok"] for i in heartbeats), [replies[i] for i in heartbeats]
        made = [replies[i]["session"] for i in makes if replies[i]["ok"]]
        refusals = [replies[i] for i in makes if not replies[i]["ok"]]
        # at most the burst and what the bucket refilled while the flood was served
        assert len(made) + 1 <= burst + rate * flood_s, (len(made), flood_s)
        assert made and refusals, (len(made), len(refusals), flood_s)
        for reply in refusals:
            refused(reply, "--max-requests-per-second", str(rate), str(burst), "retry in",
                    "not executed")
        # closes come right after the flood, with the bucket about empty: never throttled
        for session in made:
            attacker.post({"type": "close", "session": session})
        assert all(reply["ok"] for reply in attacker.replies(len(made)).values())
        # recovery: the bucket refills at the rate (by the clock, whatever
        # the machine's speed): enough for the two statuses below
        time.sleep(3 / rate)
        status = attacker.ok({"type": "status"})
        # the refused makes were not executed: only the bystander's session and `kept`
        assert (status["sessions"], status["clients"]) == (2, 2), status
        attacker.ok({"type": "close", "session": kept})
        # (one status: polling at 50 Hz would be throttled itself)
        assert attacker.ok({"type": "status"})["shm_bytes"] == segment_bytes("CartPole-v1", 8)

        # through the client library: a refused step is not executed, so after
        # backing off the env steps on exactly as its in-process twin
        with proc.connect() as client:
            remote = client.make("CartPole-v1", 4, seed=5)
            local = envd.make("CartPole-v1", 4, seed=5)
            try:
                assert remote.reset()[0].tobytes() == local.reset()[0].tobytes()
                rng = np.random.default_rng(1)

                def step_until_refused() -> str:
                    for _ in range(100_000):
                        actions = rng.integers(0, 2, 4)
                        try:
                            got = remote.step(actions)
                        except envd.LimitExceededError as exc:
                            return str(exc)
                        want = local.step(actions)
                        for a, b in zip(got[:4], want[:4]):
                            assert a.tobytes() == b.tobytes()
                    raise AssertionError("never throttled")

                assert "--max-requests-per-second" in step_until_refused()
                time.sleep(12 / rate)  # the bucket refills: tokens for the 10 steps below
                for _ in range(10):
                    actions = rng.integers(0, 2, 4)
                    for a, b in zip(remote.step(actions)[:4], local.step(actions)[:4]):
                        assert a.tobytes() == b.tobytes()
                step_until_refused()
            finally:
                local.close()
            remote.close()  # close and bye at once after a refusal: never throttled
        bystander.check()
    finally:
        if bystander is not None:
            bystander.close()
        attacker.close()
        context.term()
        stop_daemon(proc)
