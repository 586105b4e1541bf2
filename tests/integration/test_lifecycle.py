"""A real daemon's lifecycle: signals and drain, stale segments, one daemon per
endpoint, `envd status`, and flags from ENVD_* variables."""
from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest
from support.daemon import DEADLINE, private_namespace, segments_of, wait_until

import envd


def in_flight(env) -> bool:
    """A step of this daemon env was submitted and has not finished (the
    daemon bumps step_seq at submit and done_seq before the reply)."""
    return env._segment.step_seq > env._segment.done_seq


class Stepper(threading.Thread):
    """Steps env until a step fails; records how many succeeded and the error."""

    def __init__(self, env):
        super().__init__(daemon=True)
        self.env = env
        self.actions = np.zeros(env.num_envs, env.single_action_space.dtype)
        self.steps = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while True:
                self.env.step(self.actions)
                self.steps += 1
        except BaseException as exc:  # noqa: BLE001 -- checked by the test
            self.error = exc

    def finish(self) -> None:
        self.join(DEADLINE)
        assert not self.is_alive(), "the stepping client still waits"


# ---- signals -----------------------------------------------------------------------------
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_frees_every_segment_and_exits_0(harness, signum):
    daemon = harness.daemon("--threads", "2", "--lease-timeout", "30")
    first, second = (harness.connect(daemon, timeout=DEADLINE) for _ in range(2))
    envs = [first.make("CartPole-v1", 32, seed=0), first.make("Pendulum-v1", 8, seed=1),
            second.make("Acrobot-v1", 16, seed=2)]
    for env in envs:
        env.reset()
        env.step(env.action_space.sample())
    assert len(segments_of(daemon.pid)) == 3
    daemon.signal(signum)
    assert daemon.wait() == 0, daemon.log()
    assert segments_of(daemon.pid) == []
    assert f"{signal.Signals(signum).name}: draining" in daemon.log()


def start_big_step(harness, num_envs: int):
    """A daemon (one worker thread), a client stepping num_envs Acrobots in a
    thread, and an observer client; returns once a step is in flight."""
    daemon = harness.daemon("--threads", "1", "--lease-timeout", "30")
    client, observer = harness.connect(daemon), harness.connect(daemon)
    env = client.make("Acrobot-v1", num_envs, seed=0)
    env.reset()
    stepper = Stepper(env)
    stepper.start()
    wait_until(lambda: in_flight(env) or stepper.error is not None, what="a step in flight")
    assert stepper.error is None, repr(stepper.error)
    return daemon, observer, env, stepper


def draining_with_step_in_flight(daemon, observer, env, signum) -> tuple[bool, int]:
    """Signal; whether the daemon is draining while step number seq (the one
    in flight before the signal) is still in flight, and seq."""
    seq = env._segment.step_seq
    daemon.signal(signum)
    try:  # a request may overtake the signal (both wake the event loop at once)
        wait_until(lambda: observer.status()["draining"], what="the daemon to drain")
    except envd.ConnectionLostError:  # the step ended and the drain with it
        return False, seq
    return env._segment.done_seq < seq, seq


def test_drain_answers_the_step_in_flight_then_refuses_work(harness, monkeypatch):
    # Socket path only: it watches a step in flight in the daemon's event loop.
    monkeypatch.setenv("ENVD_FAST_PATH", "0")
    # 2**20 Acrobots take most of a second per step on one worker; should a
    # loaded machine still let the step end before the drain starts, start over.
    for _ in range(3):
        daemon, observer, env, stepper = start_big_step(harness, 1 << 20)
        caught_in_flight, in_flight_step = draining_with_step_in_flight(
            daemon, observer, env, signal.SIGTERM)
        assert daemon.wait() == 0, daemon.log()
        stepper.finish()
        assert segments_of(daemon.pid) == []
        assert isinstance(stepper.error, (envd.ShuttingDownError, envd.ConnectionLostError)), \
            repr(stepper.error)
        if caught_in_flight:
            break
    else:
        pytest.fail("could not signal the daemon while a step was in flight in 3 attempts")
    # The step in flight got its reply; the next one was refused.  (The
    # segment's counters count the env's one reset too.)
    assert stepper.steps == in_flight_step - 1
    assert env._segment.done_seq == in_flight_step


def test_second_signal_exits_1_at_once_and_frees_every_segment(harness, monkeypatch):
    # Socket path only: it watches a step in flight in the daemon's event loop.
    monkeypatch.setenv("ENVD_FAST_PATH", "0")
    for _ in range(3):
        daemon, observer, env, stepper = start_big_step(harness, 1 << 20)
        if draining_with_step_in_flight(daemon, observer, env, signal.SIGTERM)[0]:
            assert in_flight(env)
            daemon.signal(signal.SIGINT)
            assert daemon.wait() == 1, daemon.log()
            break
        assert daemon.wait() == 0, daemon.log()  # too late: the drain was over
        stepper.finish()
    else:
        pytest.fail("could not signal the daemon while a step was in flight in 3 attempts")
    assert segments_of(daemon.pid) == []
    assert "second SIGINT: exiting now" in daemon.log()
    stepper.finish()
    assert isinstance(stepper.error, envd.ConnectionLostError), repr(stepper.error)
    assert in_flight(env)  # the step never finished


# ---- stale segments --------------------------------------------------------------------
def fake_segment(harness, instance: str) -> str:
    """A segment file of the daemon instance '<pid>-<nonce>'."""
    path = f"/dev/shm/envd-{instance}-{secrets.token_hex(16)}"
    harness.files.append(path)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    os.write(fd, b"\0" * 4096)
    os.close(fd)
    return path


def test_startup_removes_segments_of_dead_daemons_only(harness, tmp_path):
    # Both daemons in a namespace of this test's: any other daemon starting
    # meanwhile (another test's) sweeps its own namespace, never these dead
    # daemons' segments, which the new daemon must find and name.
    ns = private_namespace()
    old = harness.daemon("--threads", "1", "--lease-timeout", "30", "--shm-namespace", ns)
    client = harness.connect(old)
    env = client.make("CartPole-v1", 4, seed=0)
    env.reset()
    [live_daemon_segment] = [f"/dev/shm/{name}" for name in segments_of(old.pid)]
    old_instance = live_daemon_segment.split("/")[-1].rsplit("-", 1)[0][len("envd-"):]
    assert old_instance.startswith(f"{ns}-{old.pid}-")
    assert os.path.exists(f"/dev/shm/.envd-{old_instance}.lock")
    of_old = fake_segment(harness, old_instance)
    # A daemon that died: no lock file, or a lock file nobody holds.
    of_no_lock = fake_segment(harness, f"{ns}-999999-0badf00d")
    unheld_lock = f"/dev/shm/.envd-{ns}-999998-0badf00d.lock"
    harness.files.append(unheld_lock)
    open(unheld_lock, "w").close()
    of_unheld_lock = fake_segment(harness, f"{ns}-999998-0badf00d")
    not_ours = "/dev/shm/envd-not-a-daemon-name-at-all"  # another naming: left alone
    harness.files.append(not_ours)
    open(not_ours, "w").close()
    # A dead daemon of another namespace: its own namespace's next daemon sweeps it.
    of_other_namespace = fake_segment(harness, f"{ns}x-999999-0badf00d")
    new = harness.daemon("--threads", "1", "--lease-timeout", "30", "--shm-namespace", ns)
    assert not os.path.exists(of_no_lock)
    assert not os.path.exists(of_unheld_lock) and not os.path.exists(unheld_lock)
    assert os.path.exists(of_old) and os.path.exists(live_daemon_segment)
    assert os.path.exists(not_ours) and os.path.exists(of_other_namespace)
    assert "left behind by dead daemons" in new.log()
    # The live daemon's session still works.
    with envd.make("CartPole-v1", 4, seed=0) as local:
        local.reset()
        actions = np.array([0, 1, 1, 0])
        assert env.step(actions)[0].tobytes() == local.step(actions)[0].tobytes()


def test_restart_after_sigkill_removes_the_dead_daemons_segments(harness, tmp_path):
    folder = tmp_path / "same-endpoint"
    ns = private_namespace()  # (the new daemon must be the one that sweeps: see above)
    old = harness.daemon("--threads", "1", "--lease-timeout", "30", "--shm-namespace", ns,
                         folder=folder)
    client = harness.connect(old, timeout=DEADLINE)
    envs = [client.make("CartPole-v1", 4, seed=seed) for seed in range(2)]
    for env in envs:
        env.reset()
    old.proc.kill()
    assert old.wait() == -signal.SIGKILL
    left = segments_of(old.pid)
    assert len(left) == 2
    harness.files.extend(f"/dev/shm/{name}" for name in left)
    assert os.path.exists(folder / "envd.sock")  # the dead daemon's socket file too
    new = harness.daemon("--threads", "1", "--lease-timeout", "30", "--shm-namespace", ns,
                         folder=folder)
    assert segments_of(old.pid) == []
    for name in left:
        assert name in new.log()
    with harness.connect(new) as again:
        assert again.status()["pid"] == new.pid
        again.make("CartPole-v1", 4, seed=0).reset()


# ---- one daemon per endpoint ----------------------------------------------------------
def test_second_daemon_on_the_same_endpoint_fails_and_the_first_keeps_serving(harness, tmp_path):
    first = harness.daemon("--threads", "1", "--lease-timeout", "30")
    run = subprocess.run([sys.executable, "-m", "envd", "--bind", first.endpoint,
                          "--threads", "1"], cwd=tmp_path, check=False, capture_output=True,
                         text=True, timeout=DEADLINE)
    assert run.returncode == 1, run.stdout + run.stderr
    assert f"another daemon already serves {first.endpoint}" in run.stderr
    with harness.connect(first) as client, envd.make("MountainCar-v0", 4, seed=7) as local:
        assert client.status()["pid"] == first.pid
        env = client.make("MountainCar-v0", 4, seed=7)
        assert env.reset()[0].tobytes() == local.reset()[0].tobytes()
        actions = np.array([0, 1, 2, 1])
        assert env.step(actions)[0].tobytes() == local.step(actions)[0].tobytes()
    first.signal(signal.SIGTERM)
    assert first.wait() == 0, first.log()


def test_a_taken_tcp_port_is_reported_in_one_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = subprocess.run([sys.executable, "-m", "envd", "--bind",
                              f"tcp://127.0.0.1:{port}", "--threads", "0"], cwd=tmp_path,
                             check=False, capture_output=True, text=True, timeout=DEADLINE)
    assert run.returncode == 1, run.stdout + run.stderr
    assert run.stderr.startswith("envd: cannot start: ") and "in use" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr


# ---- envd status -------------------------------------------------------------------------
def envd_status(endpoint: str, cwd, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "envd", "status", "--endpoint", endpoint,
                           *extra], cwd=cwd, check=False, capture_output=True, text=True,
                          timeout=DEADLINE)


def test_envd_status_prints_the_daemons_json(harness, tmp_path):
    daemon = harness.daemon("--threads", "2", "--lease-timeout", "30")
    client = harness.connect(daemon)
    env = client.make("CartPole-v1", 5, seed=0)
    env.reset()
    for _ in range(3):
        env.step(np.zeros(5, np.int64))
    run = envd_status(daemon.endpoint, tmp_path, "--json")
    assert run.returncode == 0, run.stderr
    status = json.loads(run.stdout)
    assert status["pid"] == daemon.pid
    assert status["sessions"] == 1 and status["envs"] == 5 and status["threads"] == 2
    assert status["endpoints"] == [daemon.endpoint]
    [row] = status["session_table"]
    assert row["session"] == env.session[:8] and row["env_id"] == "CartPole-v1"
    assert row["num_envs"] == row["batch_size"] == 5 and row["env_steps"] == 15


def test_envd_status_prints_a_table(harness, tmp_path):
    daemon = harness.daemon("--threads", "2", "--lease-timeout", "30")
    client = harness.connect(daemon)
    sync = client.make("CartPole-v1", 5, seed=0)
    sync.reset()
    sync.step(np.zeros(5, np.int64))
    batched = client.make("Acrobot-v1", 8, seed=0, batch_size=4)
    batched.async_reset()
    ids = batched.recv()[4]["env_id"]
    batched.send(np.zeros(4, np.int64), ids)
    batched.recv()
    run = envd_status(daemon.endpoint, tmp_path)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("envd ") and f"pid {daemon.pid}" in lines[0]
    assert "threads 2" in lines[0] and "sessions 2" in lines[0] and "envs 13" in lines[0]
    assert lines[1].startswith("env steps 9 ")  # 5 sync + 4 async env steps
    header = next(i for i, line in enumerate(lines) if line.startswith("SESSION"))
    rows = {line.split()[1]: line.split() for line in lines[header + 1:]}
    assert rows["CartPole-v1"][:4] == [sync.session[:8], "CartPole-v1", "5", "5"]
    assert rows["Acrobot-v1"][:4] == [batched.session[:8], "Acrobot-v1", "8", "4"]


def test_envd_status_without_a_daemon_exits_1(tmp_path):
    missing = f"ipc://{tmp_path}/nothing/envd.sock"
    run = envd_status(missing, tmp_path)
    assert run.returncode == 1
    assert run.stdout == ""
    assert run.stderr.startswith(f"envd status: no envd daemon at {missing}")
    # A socket file nobody listens on (a crashed daemon's): refused at once.
    dead = tmp_path / "dead.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(dead))
    run = envd_status(f"ipc://{dead}", tmp_path, "--timeout", "30")
    assert run.returncode == 1
    assert f"envd status: no envd daemon at ipc://{dead}" in run.stderr
    assert "has no listener" in run.stderr


# ---- flags from the environment ----------------------------------------------------------
def test_flags_from_envd_variables_and_the_command_line_wins(harness):
    variables = {"ENVD_MAX_SESSIONS": "1", "ENVD_LEASE_TIMEOUT": "3", "ENVD_THREADS": "1"}
    from_env = harness.daemon(env=variables)
    client = harness.connect(from_env)
    status = client.status()
    assert status["limits"]["max_sessions"] == 1
    assert status["lease_timeout"] == 3.0
    assert status["threads"] == 1
    assert client.server_info["heartbeat_interval"] == pytest.approx(1.0)
    env = client.make("CartPole-v1", 2, seed=0)
    with pytest.raises(envd.LimitExceededError, match="--max-sessions"):
        client.make("CartPole-v1", 2, seed=1)
    env.close()

    flags = harness.daemon("--max-sessions", "5", "--lease-timeout", "7", "--threads", "2",
                           env=variables)
    status = harness.connect(flags).status()
    assert status["limits"]["max_sessions"] == 5
    assert status["lease_timeout"] == 7.0
    assert status["threads"] == 2


# ---- logs -----------------------------------------------------------------------------------
def test_json_logs_one_object_per_event_and_none_per_step(harness, monkeypatch):
    # Socket path only: it checks the error reply's log line (fast-path errors are raised in the trainer, not logged).
    monkeypatch.setenv("ENVD_FAST_PATH", "0")
    daemon = harness.daemon("--threads", "1", "--lease-timeout", "30", "--log-format", "json")
    client = harness.connect(daemon)
    env = client.make("CartPole-v1", 4, seed=0)
    env.reset()
    for _ in range(50):
        env.step(np.zeros(4, np.int64))
    with pytest.raises(envd.InvalidActionError):
        env.step(np.full(4, 7, np.int64))
    env.close()
    daemon.signal(signal.SIGTERM)
    assert daemon.wait() == 0, daemon.log()
    entries = [json.loads(line) for line in daemon.log().splitlines() if line.startswith("{")]
    assert entries and all({"time", "level", "logger", "pid", "message"} <= set(e) for e in entries)
    assert len(entries) < 20, entries  # a handful of events, not one line per step
    events = {e.get("event"): e for e in entries}
    me = client.client_id.hex()[:8]
    opened, closed, error = events["session_open"], events["session_close"], events["error_reply"]
    assert opened["client"] == closed["client"] == error["client"] == me
    assert opened["session"] == closed["session"] == env.session[:8]
    assert (opened["env_id"], opened["num_envs"]) == ("CartPole-v1", 4)
    assert closed["env_steps"] == 4 * 50
    assert error["code"] == "invalid_action" and isinstance(error["request_id"], int)
    assert "out of range" in error["message"] and error["level"] == "info"


def test_text_logs_carry_the_event_fields(harness):
    daemon = harness.daemon("--threads", "1", "--lease-timeout", "30")
    client = harness.connect(daemon)
    client.make("Pendulum-v1", 2, seed=0).close()
    daemon.signal(signal.SIGTERM)
    assert daemon.wait() == 0, daemon.log()
    opened = next(line for line in daemon.log().splitlines() if "event=session_open" in line)
    assert "INFO session opened: 2 x Pendulum-v1" in opened and "env_id=Pendulum-v1" in opened
