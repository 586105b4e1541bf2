"""Fault injection at scale, and permissions.

- a hundred trainer processes SIGKILLed at random points of making and
  stepping (sync and async): their sessions are reclaimed at the lease, the
  daemon returns to its baseline of fds, threads and mappings, and a
  bystander stepping throughout gets what an in-process twin gets;
- the daemon SIGKILLed and restarted on the same endpoint under connected
  clients (idle, in a step, with async batches posted, calling while it is
  down): each is told clearly, reconnects and starts over; no stale segment;
- SIGTERM under heavy sync and async stepping of several clients: every step
  in flight is answered, the rest refused clearly, exit 0, nothing left;
- a client frozen with SIGSTOP past its lease: SessionExpiredError after
  SIGCONT, and it may start over;
- permissions: the default socket folder (0700, refused when open to others
  or owned by another user), segments and lock files 0600 and the daemon's.

(test_failures.py and test_lifecycle.py have the single-client versions.)
"""
from __future__ import annotations

import json
import multiprocessing
import os
import random
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from support.daemon import (
    DEADLINE,
    DaemonProcess,
    TwinStepper,
    all_threads_stopped,
    in_bounds_actions,
    private_namespace,
    segments_of,
    wait_until,
)

import envd

TESTS = Path(__file__).resolve().parents[1]
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))
from support import fault_client  # noqa: E402 -- after the sys.path entry above


# ---- helpers ---------------------------------------------------------------------------------
class Looper(threading.Thread):
    """Calls body() until it raises; keeps the count, the error and when it came."""

    def __init__(self, body):
        super().__init__(daemon=True)
        self.body = body
        self.count = 0
        self.error: BaseException | None = None
        self.error_at: float | None = None

    def run(self) -> None:
        try:
            while True:
                self.body()
                self.count += 1
        except BaseException as exc:  # noqa: BLE001 -- checked by the test
            self.error, self.error_at = exc, time.monotonic()

    def finish(self) -> None:
        self.join(DEADLINE)
        assert not self.is_alive(), "a client call still waits"


def in_flight(env) -> bool:
    return env._segment.step_seq > env._segment.done_seq


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def tasks(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def shm_mappings(pid: int) -> int:
    with open(f"/proc/{pid}/maps") as maps:
        return sum("/dev/shm/envd-" in line for line in maps)


def lock_files_of(pid: int) -> list[str]:
    mine = re.compile(rf"\.envd-(?:[a-z][a-z0-9]*-)?{pid}-")  # (its --shm-namespace's, if any)
    return sorted(n for n in os.listdir("/dev/shm") if mine.match(n))


def warm_up(daemon: DaemonProcess, clients: int = 4, rounds: int = 3) -> None:
    """Concurrent makes from several clients, so the daemon's lazily started
    threads (its executor's) exist before a baseline is taken."""
    errors: list[BaseException] = []

    def cycle() -> None:
        try:
            with daemon.connect() as client:
                env = client.make("CartPole-v1", 64, seed=0)
                env.reset()
                env.step(np.zeros(64, np.int64))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    for _ in range(rounds):
        threads = [threading.Thread(target=cycle) for _ in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(DEADLINE)
    assert not errors, errors


# ---- 1. a hundred trainers SIGKILLed at random points -----------------------------------
TRAINERS = 100
ALIVE_AT_ONCE = 12
SEED = 20240611


def test_hundred_sigkilled_trainers_are_reclaimed_and_the_bystander_never_notices(harness, tmp_path):
    started = time.monotonic()
    rng = random.Random(SEED)
    # A lease of 5 s: short enough to reclaim 100 kills quickly, long enough
    # that a live trainer starved of CPU on a loaded 2-core box keeps its envs.
    daemon = harness.daemon("--threads", "2", "--lease-timeout", "5")
    observer = harness.connect(daemon)
    ctx = multiprocessing.get_context("forkserver")
    # What every trainer needs, imported once by the forkserver (Python 3.11
    # does not give the forkserver the test's sys.path, so fault_client itself
    # cannot be preloaded; it is small).  pytest: a forked child re-runs the
    # `pytest` script as __mp_main__, which imports pytest.
    ctx.set_forkserver_preload(["envd", "numpy", "gymnasium", "pytest"])
    warmer = ctx.Process(target=fault_client.noop)  # start the forkserver (imports envd once)
    warmer.start()
    warmer.join(DEADLINE)
    assert warmer.exitcode == 0
    warm_up(daemon)
    bystander = TwinStepper(harness.connect(daemon), "Acrobot-v1", 16, seed=7,
                            autoreset_mode="same_step")
    bystander.start()
    wait_until(lambda: bystander.steps >= 5 or bystander.error is not None,
               what="the bystander to step")
    wait_until(lambda: observer.status()["sessions"] == 1 and len(segments_of(daemon.pid)) == 1
               and shm_mappings(daemon.pid) == 1, what="the warm-up's sessions to go")
    baseline_fds, baseline_tasks = fds(daemon.pid), tasks(daemon.pid)
    [bystander_segment] = segments_of(daemon.pid)

    progress = ctx.RawArray("q", 2 * TRAINERS)
    env_ids = envd.list_envs()  # (multi-agent ones too: the daemon serves them)
    alive: dict[int, tuple[multiprocessing.Process, float | None, bool]] = {}
    phase_at_kill: list[int] = []
    steps_at_kill: list[int] = []
    max_sessions = max_segments = 0
    spawned: dict[int, float] = {}
    to_stepping: list[float] = []
    next_index = 0
    last_status = 0.0

    def log_of(index: int) -> str:
        path = tmp_path / f"trainer-{index}.log"
        return path.read_text() if path.exists() else "(no log)"

    loop_deadline = time.monotonic() + 4 * DEADLINE
    while next_index < TRAINERS or alive:
        assert time.monotonic() < loop_deadline, "the trainers took far too long"
        assert bystander.error is None, repr(bystander.error)
        while next_index < TRAINERS and len(alive) < ALIVE_AT_ONCE:
            index = next_index
            proc = ctx.Process(target=fault_client.trainer, args=(
                daemon.endpoint, index, SEED + index, env_ids, progress,
                str(tmp_path / f"trainer-{index}.log")))
            proc.start()
            harness.procs.append(proc)
            # One in five is killed at any point from its start (connecting,
            # making, resetting), the others at a random point of stepping.
            from_start = rng.random() < 0.2
            alive[index] = (proc, None, from_start)
            spawned[index] = time.monotonic()
            next_index += 1
        now = time.monotonic()
        for index, (proc, kill_at, from_start) in list(alive.items()):
            phase = progress[2 * index]
            assert phase != fault_client.FAILED, f"trainer {index} failed:\n{log_of(index)}"
            assert proc.exitcode is None, \
                f"trainer {index} exited by itself ({proc.exitcode}):\n{log_of(index)}"
            if kill_at is None and phase >= (fault_client.STARTED if from_start
                                             else fault_client.STEPPING):
                kill_at = now + rng.uniform(0, 0.25 if from_start else 0.6)
                alive[index] = (proc, kill_at, from_start)
                if phase == fault_client.STEPPING:
                    to_stepping.append(now - spawned[index])
            if kill_at is not None and now >= kill_at:
                proc.kill()
                phase_at_kill.append(progress[2 * index])
                steps_at_kill.append(progress[2 * index + 1])
                proc.join(DEADLINE)
                assert proc.exitcode == -signal.SIGKILL, (index, proc.exitcode, log_of(index))
                del alive[index]
        if now - last_status > 0.25:
            last_status = now
            max_sessions = max(max_sessions, observer.status()["sessions"])
            max_segments = max(max_segments, len(segments_of(daemon.pid)))
        time.sleep(0.01)
    last_kill = time.monotonic()
    stepping_phase = time.monotonic() - started

    def reclaimed() -> bool:
        status = observer.status()
        return (status["sessions"] == 1 and status["clients"] == 2
                and segments_of(daemon.pid) == [bystander_segment])

    wait_until(reclaimed, what="every killed trainer's sessions and client record to go")
    reclaim_s = time.monotonic() - last_kill
    wait_until(lambda: shm_mappings(daemon.pid) == 1, what="the daemon to unmap the segments")
    wait_until(lambda: fds(daemon.pid) == baseline_fds,
               what=f"the daemon's fds to return to {baseline_fds} (now {fds(daemon.pid)})")
    wait_until(lambda: tasks(daemon.pid) == baseline_tasks,
               what=f"the daemon's threads to return to {baseline_tasks} (now {tasks(daemon.pid)})")
    # The bystander keeps stepping after the storm, still identical to its twin.
    steps = bystander.steps
    wait_until(lambda: bystander.error is not None or bystander.steps >= steps + 20,
               what="the bystander to keep stepping")
    bystander.finish()
    assert daemon.proc.poll() is None
    assert "event=lease_expired" in daemon.log()
    assert "Traceback" not in daemon.log() and "internal error" not in daemon.log()
    # The kills hit every phase, most of them while stepping.
    killed_stepping = sum(p == fault_client.STEPPING for p in phase_at_kill)
    assert len(phase_at_kill) == TRAINERS
    assert killed_stepping >= TRAINERS // 2, phase_at_kill
    assert max_sessions > 10, max_sessions
    print(f"\n{TRAINERS} trainers killed in {stepping_phase:.1f} s ({killed_stepping} while "
          f"stepping, phases {sorted(set(phase_at_kill))}, up to {max(steps_at_kill)} steps); "
          f"peak {max_sessions} sessions / {max_segments} segments; reclaimed "
          f"{reclaim_s:.1f} s after the last kill; bystander {bystander.steps} steps; "
          f"total {time.monotonic() - started:.1f} s; spawn to stepping: median "
          f"{np.median(to_stepping):.2f} s, max {max(to_stepping):.2f} s")
    bystander.remote.close()
    daemon.signal(signal.SIGTERM)
    assert daemon.wait() == 0, daemon.log()
    assert segments_of(daemon.pid) == []


# ---- 2. the daemon SIGKILLed and restarted under connected clients ------------------------
LOST = (envd.ConnectionLostError, envd.SessionExpiredError, envd.UnknownSessionError)


def test_daemon_sigkilled_and_restarted_under_connected_clients(harness, tmp_path, monkeypatch):
    # Socket path only: it watches steps in flight in the daemon's event loop.
    monkeypatch.setenv("ENVD_FAST_PATH", "0")
    folder = tmp_path / "same-endpoint"
    # A namespace of this test's: the new daemon, not another test's starting
    # meanwhile, sweeps the old one's segments (and names them in its log).
    ns = private_namespace()
    old = harness.daemon("--threads", "2", "--lease-timeout", "30", "--shm-namespace", ns,
                         folder=folder)
    timeout = 20.0
    idle_client, stepping_client, async_client, down_client = (
        harness.connect(old, timeout=timeout) for _ in range(4))
    idle_env = idle_client.make("CartPole-v1", 8, seed=1)
    idle_env.reset()
    idle_env.step(np.zeros(8, np.int64))
    down_env = down_client.make("MountainCar-v0", 4, seed=2)
    down_env.reset()
    async_env = async_client.make("Pendulum-v1", 64, seed=3, batch_size=16)
    async_env.async_reset()
    # Receive every env, so that the next recv must ask the daemon (envs
    # already ready are returned from the segment without a round trip), and
    # send them all back: posted, in flight at the kill.
    ids = np.concatenate([async_env.recv()[4]["env_id"].copy() for _ in range(4)])
    assert sorted(ids.tolist()) == list(range(64))
    async_env.send(np.zeros((64, 1), np.float32), ids)
    big = stepping_client.make("Acrobot-v1", 1 << 16, seed=4)
    big.reset()
    actions = np.zeros(1 << 16, np.int64)
    stepper = Looper(lambda: big.step(actions))
    stepper.start()
    wait_until(lambda: stepper.count >= 3 or stepper.error is not None, what="the stepper to step")
    assert stepper.error is None, repr(stepper.error)
    wait_until(lambda: in_flight(big) or stepper.error is not None, what="a step in flight")

    old.proc.kill()
    killed = time.monotonic()
    assert old.wait() == -signal.SIGKILL
    left = segments_of(old.pid)
    assert len(left) == 4

    # The stepping client learns at once, not at its timeout (the bound
    # that tells the two apart, whatever the machine's speed).
    stepper.finish()
    assert isinstance(stepper.error, envd.ConnectionLostError), repr(stepper.error)
    assert stepper.error_at - killed < timeout
    # A call while no daemon runs: told at once too.
    start = time.monotonic()
    with pytest.raises(envd.ConnectionLostError):
        down_env.step(np.zeros(4, np.int64))
    assert time.monotonic() - start < timeout

    new = harness.daemon("--threads", "2", "--lease-timeout", "30", "--shm-namespace", ns,
                         folder=folder)
    assert new.endpoint == old.endpoint
    assert segments_of(old.pid) == [], "the dead daemon's segments outlived the restart"
    assert lock_files_of(old.pid) == []
    for name in left:
        assert name in new.log()
    # Give the old clients' sockets a moment to reconnect to the new daemon
    # (pacing only: reconnected or not, each call below must fail with a
    # LOST error, which is what is checked).
    time.sleep(0.5)

    # The clients that did not call while the daemon was down: their next
    # call fails clearly (never a timeout, never a hang), and so does every
    # later one.
    outcomes = {}
    for name, call in [("idle step", lambda: idle_env.step(np.zeros(8, np.int64))),
                       ("async recv", async_env.recv),
                       ("async recv again", async_env.recv),
                       ("idle status", idle_client.status),
                       ("stepping status", stepping_client.status),
                       ("down status", down_client.status)]:
        start = time.monotonic()
        try:
            call()
            outcomes[name] = None
        except envd.EnvdError as exc:
            outcomes[name] = exc
        elapsed = time.monotonic() - start
        assert elapsed < timeout, f"{name}: {elapsed:.1f} s for {outcomes[name]!r}"
    for name, outcome in outcomes.items():
        assert isinstance(outcome, LOST), f"{name}: {outcome!r}"
    print("\nafter the restart: " + ", ".join(f"{name}: {type(outcome).__name__}"
                                          for name, outcome in outcomes.items()))
    assert new.log().count("internal error") == 0
    for client in (idle_client, stepping_client, async_client, down_client):
        start = time.monotonic()
        client.close()
        # (a close waits for its bye's reply at most 5 s: under that, it did not wait)
        assert time.monotonic() - start < 5, "closing a client of the dead daemon waits"

    # Each may connect again and make its envs anew on the new daemon.
    remade = []
    for env_id, num_envs, seed, kwargs in [("CartPole-v1", 8, 1, {}), ("MountainCar-v0", 4, 2, {}),
                                           ("Acrobot-v1", 1 << 10, 4, {})]:
        client = harness.connect(new, timeout=timeout)
        assert client.status()["pid"] == new.pid
        stepper = TwinStepper(client, env_id, num_envs, seed, **kwargs)
        stepper.start()
        wait_until(lambda stepper=stepper: stepper.steps >= 10 or stepper.error is not None,
                   what=f"the remade {env_id} to step")
        stepper.finish()
        remade.append(stepper.remote._segment.name)
    again = harness.connect(new, timeout=timeout)
    # Async on the new daemon: env i's k-th result is that of a sync twin after
    # k steps (the ready order itself depends on which batch finishes first).
    with again.make("Pendulum-v1", 64, seed=3, batch_size=16) as env, \
            envd.make("Pendulum-v1", 64, seed=3) as twin:
        trajectory = [twin.reset()[0].copy()]
        for _ in range(10):
            trajectory.append(twin.step(np.full((64, 1), 0.5, np.float32))[0].copy())
        env.async_reset()
        returned = np.zeros(64, np.int64)
        for _ in range(10):
            obs, _, _, _, info = env.recv()
            ids = info["env_id"]
            assert obs.tobytes() == np.stack([trajectory[returned[i]][i] for i in ids]).tobytes()
            returned[ids] += 1
            env.send(np.full((len(ids), 1), 0.5, np.float32), ids)
        assert sorted(segments_of(new.pid)) == sorted(remade + [env._segment.name])
    new.signal(signal.SIGTERM)
    assert new.wait() == 0, new.log()
    assert segments_of(new.pid) == [] and segments_of(old.pid) == []
    assert not (folder / "envd.sock").exists()


# ---- 3. SIGTERM under heavy stepping -----------------------------------------------------
def test_sigterm_under_heavy_sync_and_async_stepping_drains_and_exits_0(harness, monkeypatch):
    # Socket path only: it watches steps in flight in the daemon's event loop.
    monkeypatch.setenv("ENVD_FAST_PATH", "0")
    daemon = harness.daemon("--threads", "2", "--lease-timeout", "30")
    refused = (envd.ShuttingDownError, envd.ConnectionLostError)
    sync_envs, async_envs, loopers = [], [], []
    for env_id, num_envs in [("Acrobot-v1", 1 << 18), ("Pendulum-v1", 1 << 17)]:
        env = harness.connect(daemon).make(env_id, num_envs, seed=len(sync_envs))
        env.reset()
        actions = np.zeros((num_envs, *env.single_action_space.shape),
                           env.single_action_space.dtype)
        sync_envs.append(env)
        loopers.append(Looper(lambda env=env, actions=actions: env.step(actions)))
    for env_id, num_envs, batch in [("Acrobot-v1", 1 << 17, 1 << 15),
                                    ("MountainCarContinuous-v0", 1 << 16, 1 << 13)]:
        env = harness.connect(daemon).make(env_id, num_envs, seed=5, batch_size=batch)
        env.async_reset()
        space = env.single_action_space
        rng = np.random.default_rng(0)

        def recv_send(env=env, space=space, rng=rng):
            ids = env.recv()[4]["env_id"]
            env.send(in_bounds_actions(space, len(ids), rng), ids)

        async_envs.append(env)
        loopers.append(Looper(recv_send))
    twin = TwinStepper(harness.connect(daemon), "CartPole-v1", 1 << 14, seed=11)
    for looper in loopers:
        looper.start()
    twin.start()
    wait_until(lambda: all(lp.count >= 2 or lp.error for lp in loopers) and twin.steps >= 2,
               what="every client to step")
    assert not any(lp.error for lp in loopers), [lp.error for lp in loopers]
    wait_until(lambda: all(in_flight(env) for env in sync_envs) or any(lp.error for lp in loopers),
               what="both big sync steps in flight at once")
    seq_at_signal = [env._segment.step_seq for env in sync_envs]
    daemon.signal(signal.SIGTERM)
    signalled = time.monotonic()
    assert daemon.wait() == 0, daemon.log()
    exited = time.monotonic()
    for looper in loopers:
        looper.finish()
    twin.finish(expect_error=True)
    assert isinstance(twin.error, refused), repr(twin.error)  # (not a mismatch)
    for looper in loopers:
        assert isinstance(looper.error, refused), repr(looper.error)
    for env, seq, looper in zip(sync_envs, seq_at_signal, loopers):
        # The step in flight at the signal finished, and every step the daemon
        # finished was answered (the segment's counters count the reset too).
        assert env._segment.done_seq >= seq
        assert looper.count == env._segment.done_seq - 1, (looper.count, env._segment.done_seq)
        assert not in_flight(env)
    assert segments_of(daemon.pid) == []
    assert lock_files_of(daemon.pid) == []
    assert not Path(daemon.endpoint[len("ipc://"):]).exists()
    assert "SIGTERM: draining" in daemon.log()
    print(f"\ndrained and exited {exited - signalled:.2f} s after SIGTERM; steps "
          f"{[lp.count for lp in loopers]} + twin {twin.steps}; errors "
          f"{[type(lp.error).__name__ for lp in loopers]}")


# ---- 4. a client frozen past its lease -----------------------------------------------------
def test_client_frozen_with_sigstop_past_its_lease(harness, tmp_path):
    daemon = harness.daemon("--threads", "1", "--lease-timeout", "2")
    observer = harness.connect(daemon)
    with open(tmp_path / "frozen.err", "a+") as err:  # append: the child writes at the end whatever our offset
        proc = subprocess.Popen([sys.executable, str(TESTS / "support" / "fault_client.py"), "frozen",
                                 daemon.endpoint], cwd=tmp_path, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err, text=True)
        harness.procs.append(proc)
        ready = proc.stdout.readline().strip()
        err.seek(0)
        assert ready == "ready", err.read()
        assert observer.status()["sessions"] == 2
        assert len(segments_of(daemon.pid)) == 2
        proc.send_signal(signal.SIGSTOP)
        wait_until(lambda: all_threads_stopped(proc.pid), what="the client to stop")
        wait_until(lambda: observer.status()["sessions"] == 0 and segments_of(daemon.pid) == [],
                   what="the frozen client's sessions to expire")
        # Not before the lease ran out, counted from the last message the
        # daemon had from the client (its log says how long the silence was;
        # the time since the stop would depend on when the last heartbeat,
        # delayed or not by a loaded machine, came before it).
        assert "event=lease_expired" in daemon.log()
        silences = [float(s) for s in re.findall(r"lease expired after ([0-9.]+) s of silence",
                                                 daemon.log())]
        assert silences and min(silences) >= 2.0, silences
        time.sleep(1)  # well past the lease
        proc.send_signal(signal.SIGCONT)
        out, _ = proc.communicate("go\n", timeout=DEADLINE)
        err.seek(0)
        assert proc.returncode == 0, err.read()
    result = json.loads(out.strip().splitlines()[-1])
    for call in ("step", "recv", "step_again"):
        outcome = result[call]
        assert outcome["error"] == "SessionExpiredError", (call, outcome)
        assert outcome["is_session_expired"], (call, outcome)
        assert "lease" in outcome["message"] and "expired" in outcome["message"], outcome
    assert result["sessions"][0] in result["step"]["message"]
    assert result["sessions"][1] in result["recv"]["message"]
    assert result["new_env_same_as_twin"] is True
    assert result["status_sessions"] == 1
    assert observer.status()["sessions"] == 0
    assert segments_of(daemon.pid) == []


# ---- 5. permissions ---------------------------------------------------------------------
def clean_environ(**extra: str) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith("ENVD_") and k != "XDG_RUNTIME_DIR"}
    environ.update(extra)
    return environ


def start_default_daemon(cwd: Path, environ: dict[str, str], *, umask: int = 0,
                         user: int | None = None) -> subprocess.Popen:
    """`envd` without --bind (the default endpoint), under umask, as user."""
    prefix = []
    if user is not None:
        prefix = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"]
    return popen_with_umask(
        umask, [*prefix, sys.executable, "-m", "envd", "--threads", "1", "--lease-timeout", "30"],
        cwd=cwd, env=environ)


def popen_with_umask(umask: int, argv: list[str], **kwargs) -> subprocess.Popen:
    """argv under umask (exec'd by a shell: the pid is argv's), output in stdout."""
    return subprocess.Popen(["sh", "-c", f'umask {umask:03o} && exec "$0" "$@"', *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)


def connect_when_up(proc: subprocess.Popen, endpoint: str) -> envd.Client:
    result: list[envd.Client] = []

    def answers() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"the daemon exited with {proc.returncode}:\n{proc.stdout.read()}")
        try:
            result.append(envd.connect(endpoint, timeout=2))
            return True
        except (envd.ConnectionLostError, envd.EnvdTimeoutError):
            return False

    wait_until(answers, what=f"the daemon at {endpoint}")
    return result[0]


def check_segments_and_lock(pid: int, uid: int) -> None:
    names = segments_of(pid)
    assert names
    for name in names + lock_files_of(pid):
        info = os.lstat(f"/dev/shm/{name}")
        assert stat.S_ISREG(info.st_mode), name
        assert stat.S_IMODE(info.st_mode) == 0o600, (name, oct(info.st_mode))
        assert info.st_uid == uid, (name, info.st_uid)
    assert len(lock_files_of(pid)) == 1


def stop_default_daemon(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=DEADLINE)
    assert proc.returncode == 0, out
    assert segments_of(proc.pid) == [] and lock_files_of(proc.pid) == []
    return out


def test_default_socket_folder_segments_and_lock_are_private(tmp_path):
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    os.chmod(runtime, 0o700)
    proc = start_default_daemon(tmp_path, clean_environ(XDG_RUNTIME_DIR=str(runtime)))
    try:
        client = connect_when_up(proc, f"ipc://{runtime}/envd.sock")
        with client:
            envs = [client.make("CartPole-v1", 4, seed=0),
                    client.make("Snake-v0", 2, seed=1, batch_size=1)]
            envs[0].reset()
            envs[1].async_reset()
            folder = os.lstat(runtime)
            assert stat.S_IMODE(folder.st_mode) == 0o700 and folder.st_uid == os.getuid()
            sock = os.lstat(runtime / "envd.sock")
            assert stat.S_ISSOCK(sock.st_mode) and sock.st_uid == os.getuid()
            print(f"\nsocket file mode under umask 0: {oct(stat.S_IMODE(sock.st_mode))}")
            assert client.status()["endpoints"] == [f"ipc://{runtime}/envd.sock"]
            check_segments_and_lock(proc.pid, os.getuid())  # under umask 0
    finally:
        if proc.poll() is None:
            stop_default_daemon(proc)
    assert not (runtime / "envd.sock").exists()


def unused_uid() -> int:
    """A uid no account has and no /tmp/envd-<uid> folder names, from a
    random start: two test runs on one machine seldom pick the same one."""
    start = secrets.randbelow(900)
    for uid in (61000 + (start + k) % 1000 for k in range(1000)):
        if not os.path.exists(f"/tmp/envd-{uid}"):
            try:
                import pwd
                pwd.getpwuid(uid)
            except KeyError:
                return uid
    pytest.fail("no unused uid")


OTHER_USER_CLIENT = """
import sys, time, envd
start = time.monotonic()
try:
    envd.connect(sys.argv[1], timeout=30)
    print("connected")
except envd.EnvdError as exc:
    print(type(exc).__name__, round(time.monotonic() - start, 1), exc)
"""


def test_fallback_folder_is_created_0700_and_segments_belong_to_the_daemons_user(tmp_path):
    """Without XDG_RUNTIME_DIR the socket goes to /tmp/envd-<uid>, created 0700
    (under umask 0); a daemon of another user owns its segments, mode 0600,
    and a third user can neither connect nor hang trying."""
    if os.getuid() != 0 or shutil.which("setpriv") is None:
        pytest.fail("this test needs root and setpriv to run the daemon as another user")
    uid = unused_uid()
    can_import = subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", sys.executable,
         "-c", "import envd.tools.cli"], cwd="/", capture_output=True, text=True, check=False)
    if can_import.returncode != 0:  # e.g. a virtualenv inside a 0700 home or mktemp folder
        pytest.skip(f"another user cannot run {sys.executable} with envd (the environment "
                    "is private to this user); .ci/run makes its virtualenv readable so CI "
                    f"runs this test: {can_import.stderr.strip()[-200:]}")
    folder = Path(f"/tmp/envd-{uid}")
    cwd = Path("/")  # one the other users may enter, without an envd/ folder
    proc = start_default_daemon(cwd, clean_environ(), user=uid)
    try:
        client = connect_when_up(proc, f"ipc://{folder}/envd.sock")  # root may connect
        with client:
            env = client.make("Acrobot-v1", 8, seed=0)
            env.reset()
            info = os.lstat(folder)
            assert stat.S_ISDIR(info.st_mode) and info.st_uid == uid
            assert stat.S_IMODE(info.st_mode) == 0o700, oct(info.st_mode)
            check_segments_and_lock(proc.pid, uid)
            assert client.status()["pid"] == proc.pid
            # Another (non-root) user: the folder keeps it out, with a clear error.
            other = subprocess.run(
                ["setpriv", f"--reuid={uid + 1}", f"--regid={uid + 1}", "--clear-groups",
                 sys.executable, "-c", OTHER_USER_CLIENT, f"ipc://{folder}/envd.sock"],
                cwd=cwd, capture_output=True, text=True, timeout=DEADLINE, env=clean_environ(),
                check=False)
            assert other.returncode == 0, other.stderr
            assert other.stdout.startswith("ConnectionLostError"), other.stdout
            assert "permission denied" in other.stdout, other.stdout  # says why, at once
            assert float(other.stdout.split()[1]) < 30, other.stdout  # not after the timeout
            print(f"\nanother user connecting: {other.stdout.strip()}")
    finally:
        if proc.poll() is None:
            stop_default_daemon(proc)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("mode, owner", [(0o750, None), (0o705, None), (0o711, None),
                                         (0o700, "other")],
                         ids=["group-rx", "other-rx", "other-x", "other-owner"])
def test_default_folder_open_to_others_is_refused(tmp_path, mode, owner):
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    os.chmod(runtime, mode)
    if owner == "other":
        if os.getuid() != 0:
            pytest.fail("this case needs root to give the folder to another user")
        os.chown(runtime, unused_uid(), -1)
    proc = start_default_daemon(tmp_path, clean_environ(XDG_RUNTIME_DIR=str(runtime)), umask=0o022)
    out, _ = proc.communicate(timeout=DEADLINE)
    assert proc.returncode == 1, out
    assert f"{runtime} must be a directory owned by uid {os.getuid()} with mode 0700" in out
    assert f"it is {oct(mode)}" in out
    assert "Traceback" not in out
    assert os.listdir(runtime) == []  # no socket file
    assert stat.S_IMODE(os.lstat(runtime).st_mode) == mode  # left as it was
    assert segments_of(proc.pid) == [] and lock_files_of(proc.pid) == []


def test_explicit_bind_folder_is_the_users_choice(tmp_path):
    """Only the default folder is checked: --bind into an existing 0755 folder
    starts (the user chose it), so does ENVD_ENDPOINT into a 0777 one; a
    folder --bind must create is made 0700."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o755)
    with DaemonProcess(shared, "--threads", "1", "--lease-timeout", "30") as daemon:
        assert stat.S_IMODE(os.lstat(shared).st_mode) == 0o755
    assert daemon.proc.returncode == 0
    # so is a folder ENVD_ENDPOINT names (the daemon binds it by default):
    # e.g. a container's shared socket volume, world-writable
    os.chmod(shared, 0o777)
    endpoint = f"ipc://{shared}/envd.sock"
    proc = start_default_daemon(tmp_path, clean_environ(ENVD_ENDPOINT=endpoint))
    try:
        connect_when_up(proc, endpoint).close()
        assert stat.S_IMODE(os.lstat(shared).st_mode) == 0o777
    finally:
        if proc.poll() is None:
            stop_default_daemon(proc)
    created = tmp_path / "new" / "deeper"
    proc = popen_with_umask(0, [sys.executable, "-m", "envd", "--threads", "1", "--bind",
                                f"ipc://{created}/envd.sock"], cwd=tmp_path, env=clean_environ())
    try:
        connect_when_up(proc, f"ipc://{created}/envd.sock").close()
        assert stat.S_IMODE(os.lstat(created).st_mode) == 0o700
    finally:
        if proc.poll() is None:
            stop_default_daemon(proc)
