"""Issue 15's promise under one combined attack (SECURITY.md, "The promise").

While a bystander steps and checks every result against in-process twins,
hostile peers do at once:
  1. a peer of another uid pushes one endless multi-frame message into the
     ipc socket (refused before libzmq decodes a frame);
  2. a client of the daemon's own uid asks for large inline replies and
     status tables and never reads them (refused, then dropped);
  3. a client posts thousands of async sends over the socket (flow-controlled:
     no reply is lost, nothing waits out a timeout);
  5. raw connections flood the socket, over --max-connections, and never say
     hello (shed at once, or after --hello-timeout);
  6. a client sends header bombs (issue 38 N2): headers of nested empty
     arrays over --max-header-bytes, and under it with more objects than it
     allows (refused before they are decoded);
  7. a hog posts makes of a hosted env that hangs while it is made (issue 38
     N1): one runs, --max-queued-ops wait, the rest are refused at once, and
     meanwhile the bystander makes and resets a new env (first, before the
     flood may leave makes short of file descriptors; the hog's makes hang
     through every attack after it).
Afterwards the daemon is alive, its peak RSS stayed under the bound
SECURITY.md computes from its flags, its open fds under its open-file limit,
the dropped client's segments are gone, and the bystander was bit-exact
throughout.
"""
from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import msgpack
import numpy as np
import zmq
from support.daemon import DEADLINE, Bystander, DaemonProcess, peak_rss, segments_of, wait_until
from test_connections import FdWatch, flood
from test_peer_bounds import (
    as_user,
    open_folder,  # noqa: F401 -- a fixture
    other_uid,
    other_user_attack,
)
from test_unread_replies import DROPPED_LINE, Deaf

import envd
from envd import protocol

MiB = 1 << 20
FD_LIMIT = 256
MAX_CONNECTIONS = 32
MESSAGE_BYTES = 4 * MiB
SHM_BYTES = 96 * MiB
STATE_BYTES = 64 * MiB
#: Replies queued for one peer without a receipt (protocol.REPLY_QUEUE) and
#: the largest such reply (protocol.SMALL_REPLY_BYTES).
QUEUE_BYTES = protocol.REPLY_QUEUE * protocol.SMALL_REPLY_BYTES
#: The hog's env (tests/hosted/daemon_envs.py): a make of two envs in one
#: worker hangs.  Its makes wait in a queue of QUEUED_OPS.
HANGING = "envd-test/HangingMake-v0"
QUEUED_OPS = 4
HOSTED_TESTS = Path(__file__).resolve().parents[1] / "hosted"


def header_bombs() -> list[bytes]:
    """Header frames built to decode to far more than their size: over the
    header cap (under the message cap), and under it with too many objects."""
    big = MESSAGE_BYTES - 64
    over = b"\x81\xa1x\xdd" + big.to_bytes(4, "big") + b"\x90" * big
    small = protocol.DEFAULT_MAX_HEADER_BYTES - 64
    dense = b"\x81\xa1x\xdd" + small.to_bytes(4, "big") + b"\x90" * small
    deep = b"\x81\xa1x" + b"\x91" * 1000 + b"\x90"
    return [over, dense, deep]


def memory_bound(baseline: int) -> int:
    """SECURITY.md's bound for these flags: the daemon's memory before the
    attack, plus what sessions may hold (segments and state), plus unread
    replies (min(P x C, T) + C x Q x S), plus one message being read per
    connection, plus 32 MiB of allocator slack."""
    per_client, total = 2 * MESSAGE_BYTES, 8 * MESSAGE_BYTES  # the reply budgets' defaults
    replies = min(per_client * MAX_CONNECTIONS, total) + MAX_CONNECTIONS * QUEUE_BYTES
    decoding = 100 * protocol.DEFAULT_MAX_HEADER_BYTES  # D: one header being decoded
    return (baseline + SHM_BYTES + STATE_BYTES + replies + MAX_CONNECTIONS * MESSAGE_BYTES
            + decoding + 32 * MiB)


class Stepper(threading.Thread):
    """The bystander, stepping and comparing until told to stop."""

    def __init__(self, bystander: Bystander):
        super().__init__(daemon=True)
        self.bystander, self.halt, self.steps, self.error = bystander, threading.Event(), 0, None

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                self.bystander.step_and_compare(1)
                self.steps += 1
        except BaseException as exc:  # noqa: BLE001 -- reported by finish()
            self.error = exc

    def finish(self) -> int:
        self.halt.set()
        self.join(DEADLINE)
        assert not self.is_alive(), "the bystander hung"
        if self.error is not None:
            raise self.error
        return self.steps


def test_a_combined_attack_stays_within_the_documented_bounds(open_folder):  # noqa: F811 -- the fixture
    uid = other_uid()
    daemon = DaemonProcess(
        open_folder, "--threads", "1", "--lease-timeout", "20",
        "--max-message-bytes", str(MESSAGE_BYTES), "--max-shm-bytes", str(SHM_BYTES),
        "--max-state-bytes", str(STATE_BYTES), "--max-connections", str(MAX_CONNECTIONS),
        "--hello-timeout", "3", "--max-sessions-per-client", "64",
        "--import", "daemon_envs", "--python-env", HANGING, "--hosted-timeout", "600",
        "--max-queued-ops", str(QUEUED_OPS),
        prefix=("prlimit", f"--nofile={FD_LIMIT}:{FD_LIMIT}"),
        env={"PYTHONPATH": os.pathsep.join(filter(None, [str(HOSTED_TESTS),
                                                         os.environ.get("PYTHONPATH")]))})
    held: list[socket.socket] = []
    bystander = poster = deaf = bomber = hog = maker = None
    try:
        os.chmod(open_folder / "envd.sock", 0o777)  # the other uid can open it
        bystander = Bystander(daemon)
        # 3: the posting client and its env, made before the flood takes the slots
        poster = daemon.connect(timeout=DEADLINE)
        posted_env = poster.make("CartPole-v1", 4096, seed=1, batch_size=1,
                                 fast_path=False)
        posted_env.async_reset()
        # 2: the client that never reads, with large-reply sessions
        deaf = Deaf(daemon.endpoint)
        deaf.ok({"type": "hello", "version": protocol.PROTOCOL_VERSION})
        snake_makes = [deaf.ok({"type": "make", "env_id": "Snake-v0", "num_envs": 200,
                                "seed": k}) for k in range(2)]
        snakes = [made["session"] for made in snake_makes]
        deaf_segments = [made["shm"]["name"].lstrip("/") for made in snake_makes]
        # 6 and 7: raw connections of the daemon's own uid, and the
        # bystander's second client (connected before the flood takes the slots)
        bomber, hog = Deaf(daemon.endpoint), Deaf(daemon.endpoint)
        maker = daemon.connect(timeout=DEADLINE)
        for raw in (bomber, hog):
            raw.ok({"type": "hello", "version": protocol.PROTOCOL_VERSION})
        baseline = peak_rss(daemon.pid)
        bound = memory_bound(baseline)

        fds = FdWatch(daemon.pid)
        fds.start()
        stepper = Stepper(bystander)
        stepper.start()
        outcomes: dict[str, object] = {}

        # 7 first (the flood below may leave a make short of file descriptors,
        # a refusal of its own): the hog's makes hang for the whole attack
        for _ in range(1 + QUEUED_OPS + 3):
            hog.post({"type": "make", "env_id": "py:" + HANGING, "num_envs": 2,
                      "num_workers": 1})
        refusals = []
        for _ in range(3):  # the makes beyond the queue are refused at once
            assert hog.socket.poll(DEADLINE * 1000), "no refusal"
            refusals.append(msgpack.unpackb(hog.socket.recv(), raw=False))
        assert [r["code"] for r in refusals] == ["limit_exceeded"] * 3, refusals
        assert all("--max-queued-ops" in r["message"] for r in refusals), refusals
        (row,) = [r for r in maker.status()["operations"]["clients"]
                  if r["client"] == hog.socket.getsockopt(zmq.ROUTING_ID).hex()[:8]]
        assert (row["running"], row["queued"], row["refused"]) == (1, QUEUED_OPS, 3), row
        with maker.make("CartPole-v1", 4, seed=7) as env:  # meanwhile, a bystander's make
            local = envd.make("CartPole-v1", 4, seed=7)
            assert env.reset()[0].tobytes() == local.reset()[0].tobytes()
            local.close()
        assert not hog.socket.poll(0), "the hog's first make ended"

        def refused_peer() -> None:  # 1
            done = as_user(uid, other_user_attack(), str(open_folder / "envd.sock"))
            outcomes["refused peer"] = done.stdout.split()

        def never_reads() -> None:  # 2
            for k in range(120):
                deaf.post({"type": "reset", "session": snakes[k % 2], "inline": True})
                time.sleep(0.01)
            for _ in range(protocol.REPLY_QUEUE + 100):
                deaf.post({"type": "status"})

        def posts() -> None:  # 3
            start = time.monotonic()
            for _ in range(4096):
                ids = posted_env.recv()[4]["env_id"]
                posted_env.send(np.zeros(len(ids), np.int64), ids)
            posted_env.async_reset()  # every posted send's reply must be in by now
            outcomes["posting took"] = time.monotonic() - start

        def floods() -> None:  # 5
            held.extend(flood(socket.AF_UNIX, daemon.endpoint[len("ipc://"):], 200))

        def bombs() -> None:  # 6
            codes = []
            for _ in range(10):
                for bomb in header_bombs():
                    bomber.socket.send(bomb)
                    assert bomber.socket.poll(DEADLINE * 1000), "no reply to a header bomb"
                    codes.append(msgpack.unpackb(bomber.socket.recv(), raw=False)["code"])
            outcomes["header bombs"] = codes

        attackers = [threading.Thread(target=f, daemon=True)
                     for f in (refused_peer, never_reads, posts, floods, bombs)]
        for attacker in attackers:
            attacker.start()
        for attacker in attackers:
            attacker.join(DEADLINE * 3)
            assert not attacker.is_alive(), f"{attacker.name} hung"
        wait_until(lambda: DROPPED_LINE in daemon.log(), what="the deaf client to be dropped")
        wait_until(lambda: "refused a connection" in daemon.log(),
                   what="the connection cap's log line")
        # the bystander stepped under the attacks (however slowly it was scheduled)
        wait_until(lambda: stepper.steps > 0 or stepper.error is not None,
                   what="the bystander to step")
        steps = stepper.finish()
        highest_fds = fds.stop()
        peak = peak_rss(daemon.pid)
        print(f"\nbystander steps {steps}; daemon peak RSS {peak / MiB:.0f} MiB (baseline "
              f"{baseline / MiB:.0f}, bound {bound / MiB:.0f}); fds at most {highest_fds} "
              f"of {FD_LIMIT}; posting took {outcomes.get('posting took')}")

        assert daemon.proc.poll() is None, daemon.log()
        assert steps > 0
        assert outcomes["refused peer"][1] == "True", outcomes  # hung up on
        assert "posting took" in outcomes, "the posting client lost a reply"
        assert outcomes["header bombs"] == ["bad_request"] * 30, outcomes["header bombs"]
        assert not hog.socket.poll(0), "the hog's first make ended"  # (it hangs throughout)
        assert peak <= bound, f"peak RSS {peak / MiB:.0f} MiB over the bound {bound / MiB:.0f}"
        assert highest_fds < FD_LIMIT
        # the deaf client is gone with its sessions
        wait_until(lambda: not set(deaf_segments) & set(segments_of(daemon.pid)),
                   what="the dropped client's segments to go")
        bystander.check()
    finally:
        for sock in held:
            sock.close()
        for closer in (deaf, poster, bystander, bomber, hog, maker):
            if closer is not None:
                closer.close()
        daemon.stop()  # (the hog's hung makes: killed after the drain's grace)
