"""Issue 38: the lease counts from a client's last request on any path.

A client that steps only through the fast path (its doorbell: no socket
request) and sends no heartbeat lost its sessions after --lease-timeout
although it stepped all along: the lease counted from its last heartbeat or
socket request.  Now the daemon renews the lease of a client whose fast-path
sessions served requests since its last lease tick (at most min(1 s,
lease / 4) late), as users expect: a lease expires only after lease-timeout
seconds without any request, on any path (docs/protocol.md)."""
from __future__ import annotations

import time

import numpy as np
from support.daemon import wait_until

import envd

LEASE = 3.0  # (a stall of a loaded machine between two steps stays well under it)


def test_fast_path_steps_keep_the_lease_without_heartbeats(harness):
    daemon = harness.daemon("--threads", "1", "--lease-timeout", str(LEASE))
    client = harness.connect(daemon)
    remote = client.make("CartPole-v1", 4, seed=1)
    local = envd.make("CartPole-v1", 4, seed=1)
    assert remote.fast_path, "this test needs the fast path"
    # (connected first: its status right after the last step is the lease's
    # first check, with no connect between the two)
    watcher = daemon.connect()
    try:
        assert remote.reset()[0].tobytes() == local.reset()[0].tobytes()
        client.channel.stop_heartbeat()  # from now on only the doorbell speaks
        rng = np.random.default_rng(0)
        started = time.monotonic()
        steps = 0
        while time.monotonic() - started < 3 * LEASE:  # three leases of fast-path steps only
            actions = rng.integers(0, 2, 4)
            for got, want in zip(remote.step(actions)[:4], local.step(actions)[:4]):
                assert got.tobytes() == want.tobytes(), f"step {steps}"
            steps += 1
            time.sleep(0.01)
        # ... and once it stops, its lease expires: the session is freed
        assert watcher.status()["sessions"] == 1
        wait_until(lambda: watcher.status()["sessions"] == 0, what="the lease to expire")
    finally:
        watcher.close()
        local.close()
