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
     hello (shed at once, or after --hello-timeout).
Afterwards the daemon is alive, its peak RSS stayed under the bound
SECURITY.md computes from its flags, its open fds under its open-file limit,
its segments are the bystander's and the posting client's only, and the
bystander was bit-exact throughout.
"""
from __future__ import annotations

import os
import socket
import threading
import time

import numpy as np

from envd import protocol
from support.daemon import (DEADLINE, Bystander, DaemonProcess, peak_rss, segments_of,
                            wait_until)
from test_connections import FdWatch, flood
from test_peer_bounds import open_folder  # noqa: F401 -- a fixture
from test_peer_bounds import as_user, other_uid, other_user_attack
from test_unread_replies import DROPPED_LINE, Deaf

MiB = 1 << 20
FD_LIMIT = 256
MAX_CONNECTIONS = 32
MESSAGE_BYTES = 4 * MiB
SHM_BYTES = 96 * MiB
STATE_BYTES = 64 * MiB
#: Replies queued for one peer without a receipt (protocol.REPLY_QUEUE) and
#: the largest such reply (protocol.SMALL_REPLY_BYTES).
QUEUE_BYTES = protocol.REPLY_QUEUE * protocol.SMALL_REPLY_BYTES


def memory_bound(baseline: int) -> int:
    """SECURITY.md's bound for these flags: the daemon's memory before the
    attack, plus what sessions may hold (segments and state), plus unread
    replies (min(P x C, T) + C x Q x S), plus one message being read per
    connection, plus 32 MiB of allocator slack."""
    per_client, total = 2 * MESSAGE_BYTES, 8 * MESSAGE_BYTES  # the reply budgets' defaults
    replies = min(per_client * MAX_CONNECTIONS, total) + MAX_CONNECTIONS * QUEUE_BYTES
    return (baseline + SHM_BYTES + STATE_BYTES + replies + MAX_CONNECTIONS * MESSAGE_BYTES
            + 32 * MiB)


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
        except BaseException as exc:  # reported by finish()
            self.error = exc

    def finish(self) -> int:
        self.halt.set()
        self.join(DEADLINE)
        assert not self.is_alive(), "the bystander hung"
        if self.error is not None:
            raise self.error
        return self.steps


def test_a_combined_attack_stays_within_the_documented_bounds(open_folder):
    uid = other_uid()
    daemon = DaemonProcess(
        open_folder, "--threads", "1", "--lease-timeout", "20",
        "--max-message-bytes", str(MESSAGE_BYTES), "--max-shm-bytes", str(SHM_BYTES),
        "--max-state-bytes", str(STATE_BYTES), "--max-connections", str(MAX_CONNECTIONS),
        "--hello-timeout", "3", "--max-sessions-per-client", "64",
        prefix=("prlimit", f"--nofile={FD_LIMIT}:{FD_LIMIT}"))
    held: list[socket.socket] = []
    bystander = poster = deaf = None
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
        snakes = [deaf.ok({"type": "make", "env_id": "Snake-v0", "num_envs": 200,
                           "seed": k})["session"] for k in range(2)]
        baseline = peak_rss(daemon.pid)
        bound = memory_bound(baseline)

        fds = FdWatch(daemon.pid)
        fds.start()
        stepper = Stepper(bystander)
        stepper.start()
        outcomes: dict[str, object] = {}

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

        attackers = [threading.Thread(target=f, daemon=True)
                     for f in (refused_peer, never_reads, posts, floods)]
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
        assert peak <= bound, f"peak RSS {peak / MiB:.0f} MiB over the bound {bound / MiB:.0f}"
        assert highest_fds < FD_LIMIT
        # the deaf client is gone with its sessions: what is left is the
        # bystander's two and the poster's one
        wait_until(lambda: len(segments_of(daemon.pid)) == 3,
                   what="the dropped client's segments to go")
        bystander.check()
    finally:
        for sock in held:
            sock.close()
        for closer in (deaf, poster, bystander):
            if closer is not None:
                closer.close()
        daemon.stop()
