"""Failures around a real daemon: clients that die or go silent, a daemon that
stops answering or dies, no daemon at all, and a client that cannot see the
daemon's /dev/shm."""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from support.daemon import DEADLINE, DaemonProcess, TwinStepper, segments_of, wait_until

import envd


def assert_same_step(remote, local, actions) -> None:
    got, want = remote.step(actions), local.step(actions)
    for a, b in zip(got[:4], want[:4]):
        assert a.tobytes() == b.tobytes()
    assert sorted(got[4]) == sorted(want[4])


def stop_process(daemon: DaemonProcess) -> None:
    """SIGSTOP the daemon (DaemonProcess.signal waits until it is stopped)."""
    daemon.signal(signal.SIGSTOP)


def assert_stops_cleanly(daemon: DaemonProcess) -> None:
    daemon.signal(signal.SIGTERM)
    assert daemon.wait() == 0, daemon.log()
    assert segments_of(daemon.pid) == []


# ---- a client killed with SIGKILL -------------------------------------------------------
STEPPING_CLIENT = textwrap.dedent("""
    import sys
    import numpy as np
    import envd
    client = envd.connect(sys.argv[1], timeout=30)
    envs = [client.make("CartPole-v1", 64, seed=i) for i in range(2)]
    for env in envs:
        env.reset()
    actions = np.zeros(64, np.int64)
    steps = 0
    while True:
        for env in envs:
            env.step(actions)
        steps += 1
        if steps == 10:
            print("stepping", flush=True)
""")


def test_sigkilled_client_loses_its_sessions_and_others_never_notice(harness, tmp_path):
    # (3 s: a heartbeat thread a loaded machine holds back 1 s keeps its lease)
    daemon = harness.daemon("--threads", "2", "--lease-timeout", "3")
    observer = harness.connect(daemon)
    stepper = TwinStepper(harness.connect(daemon), "CartPole-v1", 16, seed=3)
    stepper.start()
    script = tmp_path / "stepping_client.py"
    script.write_text(STEPPING_CLIENT)
    out = tmp_path / "stepping_client.out"
    with open(out, "wb") as stdout:
        victim = harness.popen([sys.executable, str(script), daemon.endpoint], cwd=tmp_path,
                               stdout=stdout, stderr=subprocess.STDOUT)

    def victim_steps() -> bool:
        assert victim.poll() is None, f"the client died by itself:\n{out.read_text()}"
        return "stepping" in out.read_text()

    wait_until(victim_steps, what="the client subprocess to step")
    assert observer.status()["sessions"] == 3
    assert len(segments_of(daemon.pid)) == 3
    steps_before = stepper.steps
    victim.send_signal(signal.SIGKILL)
    victim.wait()

    def only_the_stepper_is_left() -> bool:
        status = observer.status()
        return status["sessions"] == 1 and len(segments_of(daemon.pid)) == 1

    wait_until(only_the_stepper_is_left, what="the killed client's sessions to expire")
    assert observer.status()["clients"] == 2  # the observer and the stepper
    assert segments_of(daemon.pid) == [stepper.remote._segment.name]
    assert "event=lease_expired" in daemon.log()
    expired_at = stepper.steps
    wait_until(lambda: stepper.error is not None or stepper.steps >= expired_at + 50,
               what="the concurrent client to keep stepping after the expiry")
    stepper.finish()
    assert stepper.steps > steps_before
    stepper.remote.close()
    assert_stops_cleanly(daemon)


# ---- a daemon that cannot answer, or dies ------------------------------------------------
def test_stopped_daemon_makes_the_client_time_out(harness):
    daemon = harness.daemon("--threads", "1", "--lease-timeout", "30")
    client = harness.connect(daemon, timeout=DEADLINE)  # make and reset: however slow
    env = client.make("CartPole-v1", 4, seed=0)
    env.reset()
    stop_process(daemon)
    try:
        client.timeout = 2.0  # only while the daemon cannot answer
        start = time.monotonic()
        with pytest.raises(envd.EnvdTimeoutError, match="within 2 s") as caught:
            env.step(np.zeros(4, np.int64))
        elapsed = time.monotonic() - start
    finally:
        daemon.signal(signal.SIGCONT)
    assert isinstance(caught.value, TimeoutError)
    # Not before the timeout; after it, by no more than a loaded machine's
    # scheduling delay (generous: five times the timeout).
    assert 1.9 <= elapsed < 2 + 10
    # The late reply to the step is recognised and dropped: the next request
    # gets its own reply.
    client.timeout = 30.0
    assert client.status()["pid"] == daemon.pid
    env.close()
    assert_stops_cleanly(daemon)


@pytest.mark.parametrize("fast_path", [False, True], ids=["socket", "fast path"])
def test_daemon_killed_while_the_client_waits(harness, fast_path):
    daemon = harness.daemon("--threads", "1", "--lease-timeout", "30")
    client = harness.connect(daemon, timeout=DEADLINE)
    env = client.make("CartPole-v1", 4, seed=0, fast_path=fast_path)
    env.reset()

    def waiting() -> bool:  # the step was sent (rung) and waits for its answer
        return not env._stepper.doorbell.answered if fast_path else client.channel.busy

    outcome: dict[str, object] = {}

    def step() -> None:
        try:
            env.step(np.zeros(4, np.int64))
            outcome["result"] = "a reply"
        except BaseException as exc:  # noqa: BLE001
            outcome["result"] = exc
        outcome["at"] = time.monotonic()

    stop_process(daemon)
    waiter = threading.Thread(target=step, daemon=True)
    start = time.monotonic()
    waiter.start()
    wait_until(waiting, what="the step request to be waiting for its reply")
    daemon.proc.kill()
    daemon.wait()
    waiter.join(DEADLINE)
    assert not waiter.is_alive(), "the client still waits for a dead daemon"
    assert isinstance(outcome["result"], (envd.ConnectionLostError, envd.EnvdTimeoutError)), outcome
    # Noticed before its timeout: the one bound that tells noticing from
    # timing out, whatever the machine's speed.
    assert outcome["at"] - start < client.timeout, "noticed the dead daemon only at the timeout"


# ---- leases ------------------------------------------------------------------------------
def test_silent_client_loses_its_sessions_and_can_start_over(harness):
    daemon = harness.daemon("--threads", "1", "--lease-timeout", "2")
    client = harness.connect(daemon)
    env = client.make("CartPole-v1", 8, seed=0)
    env.reset()
    assert len(segments_of(daemon.pid)) == 1
    client.channel.stop_heartbeat()  # the process is alive but sends nothing any more
    wait_until(lambda: segments_of(daemon.pid) == [], what="the silent client's segment to go")
    with pytest.raises(envd.SessionExpiredError, match="lease") as caught:
        env.step(np.zeros(8, np.int64))
    assert isinstance(caught.value, envd.UnknownSessionError)
    assert env.session in str(caught.value)
    # The same connection may start over (quickly: nothing heartbeats for it now).
    with envd.make("CartPole-v1", 8, seed=5) as local:
        again = client.make("CartPole-v1", 8, seed=5)
        assert again.reset()[0].tobytes() == local.reset()[0].tobytes()
        for action in (0, 1, 1, 0):
            assert_same_step(again, local, np.full(8, action, np.int64))
    assert segments_of(daemon.pid) == [again._segment.name]
    again.close()
    env.close()
    assert segments_of(daemon.pid) == []


def test_idle_heartbeating_client_keeps_its_sessions(harness):
    # A 3 s lease: heartbeats every second, so only a heartbeat 2 s late
    # (not a loaded machine's scheduling delay) could lose the session.
    lease = 3.0
    daemon = harness.daemon("--threads", "1", "--lease-timeout", str(lease))
    client = harness.connect(daemon)
    assert client.server_info["heartbeat_interval"] == pytest.approx(lease / 3)
    with envd.make("Pendulum-v1", 8, seed=2) as local:
        env = client.make("Pendulum-v1", 8, seed=2)
        assert env.reset()[0].tobytes() == local.reset()[0].tobytes()
        rng = np.random.default_rng(0)
        assert_same_step(env, local, rng.uniform(-2, 2, (8, 1)).astype(np.float32))
        segment = [env._segment.name]
        idle_until = time.monotonic() + 2.5 * lease  # two and a half leases without a request
        while time.monotonic() < idle_until:
            assert segments_of(daemon.pid) == segment, "the idle client lost its session"
            time.sleep(0.05)
        for _ in range(5):
            assert_same_step(env, local, rng.uniform(-2, 2, (8, 1)).astype(np.float32))
    status = client.status()
    assert status["sessions"] == 1 and status["clients"] == 1
    env.close()
    assert_stops_cleanly(daemon)


# ---- no daemon ---------------------------------------------------------------------------
def test_connect_to_a_missing_socket_fails_at_once():
    start = time.monotonic()
    with pytest.raises(envd.ConnectionLostError, match="start one with `envd") as caught:
        envd.connect("ipc:///nonexistent/path.sock", timeout=30)
    assert time.monotonic() - start < 30  # at once, not after the timeout
    assert "/nonexistent/path.sock" in str(caught.value)


def test_connect_to_a_socket_nobody_listens_on(tmp_path):
    path = tmp_path / "dead.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(path))  # the file stays after close, as after a crashed daemon
    assert path.exists()
    start = time.monotonic()
    with pytest.raises(envd.ConnectionLostError, match="has no listener; start one with `envd"):
        envd.connect(f"ipc://{path}", timeout=30)
    assert time.monotonic() - start < 30  # at once, not after the 30 s timeout


# ---- a client that cannot see the daemon's /dev/shm --------------------------------------
OTHER_SHM_CLIENT = textwrap.dedent("""
    import json, os, sys
    import envd
    result = {"shm_entries": len(os.listdir("/dev/shm"))}
    with envd.connect(sys.argv[1], timeout=30) as client:
        try:
            client.make("CartPole-v1", 4, seed=0, transport="shm")
            result["error"] = None
        except envd.EnvdError as exc:
            result["error"] = type(exc).__name__
            result["message"] = str(exc)
        result["sessions_after"] = client.status()["sessions"]
        with client.make("CartPole-v1", 4, seed=0) as env:  # auto: the arrays travel inline
            result["auto"] = env.transport
            result["obs"] = env.reset()[0].tobytes().hex()
    print(json.dumps(result))
""")


def test_client_without_the_daemons_shm_gets_shared_memory_error(harness, tmp_path):
    """transport="shm" from a client with its own /dev/shm: a clear error and no
    session left; the default (auto) falls back to the inline transport."""
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs tmpfs /dev/shm"],
                           check=False, capture_output=True, text=True)
    assert probe.returncode == 0, (
        "this test needs root and `unshare --mount` to give a client its own empty /dev/shm; "
        f"it failed here: {probe.stderr.strip()}")
    daemon = harness.daemon("--threads", "1", "--lease-timeout", "30")
    observer = harness.connect(daemon)
    script = tmp_path / "other_shm_client.py"
    script.write_text(OTHER_SHM_CLIENT)
    run = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         'mount -t tmpfs tmpfs /dev/shm && exec "$0" "$@"', sys.executable, str(script),
         daemon.endpoint],
        cwd=tmp_path, check=False, capture_output=True, text=True, timeout=DEADLINE)
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["shm_entries"] == 0  # its own /dev/shm indeed
    assert result["error"] == "SharedMemoryError", result
    assert "another host or in another IPC namespace" in result["message"]
    assert f"pid {daemon.pid}" in result["message"]
    assert result["sessions_after"] == 0  # the client closed the session it could not use
    assert result["auto"] == "inline"
    with envd.make("CartPole-v1", 4, seed=0) as local:
        assert result["obs"] == local.reset()[0].tobytes().hex()
    assert observer.status()["sessions"] == 0
    assert segments_of(daemon.pid) == []
    assert_stops_cleanly(daemon)
