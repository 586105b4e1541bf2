"""Many clients on one daemon: each gets exactly what it would get alone,
none sees another's sessions, status() counts them, and nothing leaks (file
descriptors, threads, shared-memory segments and mappings) in the daemon or
in the client process.

Run as a script (``python test_many_clients.py ENDPOINT INDEX``) this module
is one client process of test_four_client_processes."""
from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

if __name__ == "__main__":  # a worker process: find conftest and support/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import pytest
from support.builtin_envs import random_actions
from support.daemon import DEADLINE, DaemonProcess, segments_of, wait_until

import envd

#: Per client: two sessions (env_id, num_envs, seed, autoreset_mode, max_episode_steps).
CLIENT_PLANS = [
    [("CartPole-v1", 8, 1, "next_step", None), ("Pendulum-v1", 3, 2, "same_step", 40)],
    # 256 Acrobots are costly enough for the daemon to step them on its pool
    [("Acrobot-v1", 256, 3, "next_step", 60), ("MountainCar-v0", 16, 4, "disabled", 50)],
    [("MountainCarContinuous-v0", 4, 5, "same_step", 45), ("CartPole-v1", 12, 6, "disabled", None)],
    # client 0's first session again, and a reseeded copy of it: same / different digests
    [("CartPole-v1", 8, 1, "next_step", None), ("CartPole-v1", 8, 2, "next_step", None)],
]
STEPS = 150


# ---- a trajectory and its digest ----------------------------------------------------------
class Trajectory:
    """One session of a plan, stepped with seeded random actions; its sha256
    covers every result: observations, rewards, terminations, truncations,
    episode statistics (not the wall time) and final observations."""

    def __init__(self, make, plan):
        env_id, num_envs, seed, mode, limit = plan
        self.env = make(env_id, num_envs, seed=seed, autoreset_mode=mode, max_episode_steps=limit)
        self.mode = mode
        self.rng = np.random.default_rng(seed + 1000)
        self.digest = hashlib.sha256()
        self.episodes = 0

    def reset(self):
        obs, info = self.env.reset()
        assert info == {}
        self.digest.update(obs.tobytes())

    def step(self):
        env = self.env
        obs, rew, term, trunc, info = env.step(
            random_actions(env.single_action_space, env.num_envs, self.rng))
        for array in (obs, rew, term, trunc):
            self.digest.update(array.tobytes())
        self.digest.update(repr(sorted(info)).encode())
        if "envd_episode" in info:
            for array in (info["envd_episode"]["r"], info["envd_episode"]["l"], info["_envd_episode"]):
                self.digest.update(array.tobytes())
        if "final_obs" in info:
            for final in info["final_obs"]:
                self.digest.update(b"-" if final is None else final.tobytes())
        done = term | trunc
        self.episodes += int(done.sum())
        if self.mode == "disabled" and done.any():
            self.digest.update(env.reset(options={"reset_mask": done.copy()})[0].tobytes())

    def hexdigest(self):
        return self.digest.hexdigest()


def run_client(make, plans, steps=STEPS, made=None, stepped=None):
    """Make the plans' sessions with make, reset them, then step them
    interleaved, and close them; the digests, in plan order.  made() is called
    after the makes, before stepping; stepped() after stepping, before closing
    (synchronisation with other clients)."""
    trajectories = []
    try:
        for plan in plans:
            trajectories.append(Trajectory(make, plan))
        for t in trajectories:
            t.reset()
        if made is not None:
            made()
        for _ in range(steps):
            for t in trajectories:
                t.step()
        if stepped is not None:
            stepped()
        assert all(t.episodes > 0 for t in trajectories), "every run must cross episode ends"
        return [t.hexdigest() for t in trajectories]
    finally:
        for t in trajectories:
            t.env.close()


def reference_digest(plan):
    """The digest of a plan run alone, in-process."""
    return run_client(lambda *a, **k: envd.make(*a, num_threads=0, **k), [plan])[0]


@pytest.fixture(scope="module")
def references():
    digests = [[reference_digest(plan) for plan in plans] for plans in CLIENT_PLANS]
    assert digests[3][0] == digests[0][0] and digests[3][1] != digests[3][0]
    return digests


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    """One daemon for the module (2 threads, 10 s lease); it must drain to
    exit status 0 and leave no segment."""
    proc = DaemonProcess(tmp_path_factory.mktemp("many_clients") / "daemon",
                         "--threads", "2", "--lease-timeout", "10")
    try:
        yield proc
    finally:
        returncode = proc.stop()
    assert returncode == 0, proc.log()
    assert segments_of(proc.pid) == []


def env_steps_of(plans):
    return sum(num_envs for _, num_envs, *_ in plans) * STEPS


# ---- four clients ---------------------------------------------------------------------------
def test_four_client_threads_each_get_what_they_would_alone(daemon, references):
    n = len(CLIENT_PLANS)
    # made: every client made and reset its sessions; go: the observer has
    # read the status, step; stepped: every client stepped, none closed yet
    made, go, stepped = (threading.Barrier(n + 1, timeout=DEADLINE) for _ in range(3))
    results: dict[int, list[str]] = {}
    errors: list[BaseException] = []

    def worker(index):
        def on_made():
            made.wait()
            go.wait()
        try:
            with daemon.connect() as client:
                results[index] = run_client(client.make, CLIENT_PLANS[index],
                                            made=on_made, stepped=stepped.wait)
        except BaseException as exc:  # noqa: BLE001 -- report it, and free the other threads
            errors.append(exc)
            for barrier in (made, go, stepped):
                barrier.abort()

    with daemon.connect() as observer:
        before = observer.status()
        threads = [threading.Thread(target=worker, args=(i,), name=f"client-{i}") for i in range(n)]
        for thread in threads:
            thread.start()
        during = after_steps = None
        try:
            try:
                made.wait()
                during = observer.status()
                go.wait()
                stepped.wait()
                after_steps = observer.status()
            except threading.BrokenBarrierError:
                assert errors, "a barrier broke without an error in a client thread"
        finally:
            for thread in threads:
                thread.join(DEADLINE)
        assert not any(thread.is_alive() for thread in threads)
        if errors:
            raise errors[0]
        assert results == dict(enumerate(references))
        all_plans = [plan for plans in CLIENT_PLANS for plan in plans]
        assert during["sessions"] - before["sessions"] == len(all_plans) == 8
        assert during["envs"] - before["envs"] == sum(p[1] for p in all_plans)
        assert during["clients"] >= before["clients"] + n
        assert after_steps["env_steps"] - during["env_steps"] == env_steps_of(all_plans)
        wait_until(lambda: observer.status()["sessions"] == before["sessions"],
                   what="every session closed")


WORKER_TIMEOUT = 30.0


def worker_main(endpoint, index):
    """One client process: make, say "ready", wait for "go", step, print the digests."""
    with envd.connect(endpoint, timeout=WORKER_TIMEOUT) as client:
        def made():
            print("ready", flush=True)
            assert sys.stdin.readline().strip() == "go"
        digests = run_client(client.make, CLIENT_PLANS[index], made=made)
        print(json.dumps({"index": index, "pid": os.getpid(), "digests": digests}), flush=True)


def test_four_client_processes_each_get_what_they_would_alone(daemon, references, tmp_path):
    n = len(CLIENT_PLANS)
    procs, logs = [], []
    try:
        with daemon.connect() as observer, contextlib.ExitStack() as stack:
            before = observer.status()
            for index in range(n):
                log = stack.enter_context(open(tmp_path / f"client-{index}.log", "a+"))
                logs.append(log)
                procs.append(subprocess.Popen(
                    [sys.executable, os.path.abspath(__file__), daemon.endpoint, str(index)],
                    cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                    text=True))

            def stderr_of(index):
                logs[index].seek(0)
                return logs[index].read()

            for index, proc in enumerate(procs):  # every client has made its sessions
                assert proc.stdout.readline().strip() == "ready", stderr_of(index)
            during = observer.status()
            assert during["sessions"] - before["sessions"] == 2 * n
            assert during["clients"] >= before["clients"] + n
            for proc in procs:  # step all four at once
                proc.stdin.write("go\n")
                proc.stdin.flush()
            outputs = []
            for index, proc in enumerate(procs):
                out, _ = proc.communicate(timeout=DEADLINE)
                assert proc.returncode == 0, stderr_of(index)
                outputs.append(json.loads(out.strip().splitlines()[-1]))
            assert [o["index"] for o in outputs] == list(range(n))
            assert len({o["pid"] for o in outputs} | {os.getpid()}) == n + 1
            assert [o["digests"] for o in outputs] == references
            after = observer.status()
            assert after["env_steps"] - during["env_steps"] == env_steps_of(
                [plan for plans in CLIENT_PLANS for plan in plans])
            assert after["sessions"] == before["sessions"]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


# ---- isolation ------------------------------------------------------------------------------
def test_clients_do_not_see_each_others_sessions(daemon):
    with daemon.connect() as a, daemon.connect() as b, \
            envd.make("Acrobot-v1", 4, seed=9, num_threads=0) as local:
        env_a = a.make("Acrobot-v1", 4, seed=9)
        env_b = b.make("Acrobot-v1", 4, seed=9)
        assert env_a.session != env_b.session
        for env in (env_a, local):
            env.reset()
        for request in ({"type": "step", "session": env_a.session},
                        {"type": "reset", "session": env_a.session},
                        {"type": "close", "session": env_a.session}):
            with pytest.raises(envd.UnknownSessionError):
                b.channel.request(request)
        with pytest.raises(envd.UnknownSessionError):
            a.channel.request({"type": "step", "session": env_b.session})
        # B's attempts did not step, reset or close A's envs
        rng = np.random.default_rng(0)
        for step in range(30):
            actions = random_actions(local.single_action_space, 4, rng)
            assert env_a.step(actions)[0].tobytes() == local.step(actions)[0].tobytes(), step
        # and A's session still counts; B's env was never reset
        with pytest.raises(envd.EnvStateError, match="never reset"):
            env_b.step(np.zeros(4, np.int64))
        # a session id that never existed
        with pytest.raises(envd.UnknownSessionError):
            a.channel.request({"type": "step", "session": "0" * 32})


# ---- status counts ------------------------------------------------------------------------
def test_status_counts_follow_makes_and_closes(tmp_path):
    """clients/sessions/envs go up with connects and makes and down with
    closes.  A closed client's record goes at its lease expiry (Client.close
    sends no goodbye), so this daemon has a short lease."""
    with DaemonProcess(tmp_path / "daemon", "--threads", "1", "--lease-timeout", "4") as proc, \
            proc.connect() as observer:
        status = observer.status
        wait_until(lambda: status()["clients"] == 1, what="only the observer connected")
        first = status()
        assert first["pid"] == proc.pid and first["threads"] == 1
        assert (first["sessions"], first["envs"], first["env_steps"]) == (0, 0, 0)

        with proc.connect() as a, proc.connect() as b:
            assert status()["clients"] == 3
            env1 = a.make("CartPole-v1", 5)
            assert (status()["sessions"], status()["envs"]) == (1, 5)
            env2 = a.make("Pendulum-v1", 3)
            env3 = b.make("MountainCar-v0", 7)
            env4 = b.make("Acrobot-v1", 2)
            assert (status()["sessions"], status()["envs"]) == (4, 17)
            assert len(segments_of(proc.pid)) == 4
            env1.close()
            assert (status()["sessions"], status()["envs"]) == (3, 12)
            # an env dropped without close(): its session goes at its client's next request
            del env3
            gc.collect()
            a.status(), b.status()
            assert (status()["sessions"], status()["envs"]) == (2, 5)
            a.close()  # closes env2
            assert env2.closed
            assert (status()["sessions"], status()["envs"]) == (1, 2)
            assert status()["clients"] in (2, 3)  # a's record stays until its lease expires
            env4.reset()
            env4.step(np.zeros(2, np.int64))
            assert status()["env_steps"] == 2
        assert env4.closed
        assert (status()["sessions"], status()["envs"]) == (0, 0)
        assert segments_of(proc.pid) == []
        wait_until(lambda: status()["clients"] == 1, what="closed clients to be forgotten")
    assert proc.proc.returncode == 0, proc.log()


# ---- leaks ----------------------------------------------------------------------------------
def _count(path):
    return len(os.listdir(path))


def _shm_mappings(pid):
    with open(f"/proc/{pid}/maps") as maps:
        return sum("/dev/shm/envd-" in line for line in maps)


def _cycle(daemon, env_id="CartPole-v1", num_envs=4, check=None):
    with daemon.connect() as client:
        env = client.make(env_id, num_envs, seed=0)
        env.reset()
        env.step(np.zeros(num_envs, np.int64))
        if check is not None:
            check()
        env.close()


def _settled(count, still_for: float = 0.5) -> int:
    """count() once it has kept one value for still_for seconds (polled, with
    the tests' generous deadline)."""
    value, since = count(), time.monotonic()
    deadline = since + DEADLINE
    while time.monotonic() - since < still_for:
        assert time.monotonic() < deadline, "the count never settled"
        time.sleep(0.02)
        if (now := count()) != value:
            value, since = now, time.monotonic()
    return value


def test_no_leaks_in_the_daemon(daemon):
    pid = daemon.pid

    def fds() -> int:
        return _count(f"/proc/{pid}/fd")

    def tasks() -> int:
        return _count(f"/proc/{pid}/task")

    for _ in range(5):  # warm-up: lazily created threads, caches
        _cycle(daemon)
    assert segments_of(pid) == []
    wait_until(lambda: _shm_mappings(pid) == 0, what="the daemon to unmap its segments")
    # libzmq closes a gone client's sockets in its own time: the baseline is
    # the count once it has stopped moving, not a count with some still open.
    baseline_fds, baseline_tasks = _settled(fds), _settled(tasks)

    def while_connected():  # what the counts measure moves while a client is there
        assert fds() > baseline_fds
        assert len(segments_of(pid)) == 1 and _shm_mappings(pid) >= 1

    _cycle(daemon, check=while_connected)
    for _ in range(50):
        _cycle(daemon)
    # (at most: a leak only raises them, and a socket of the warm-up that
    # libzmq closed after the baseline settled lowers them for good)
    wait_until(lambda: fds() <= baseline_fds,
               what=f"the daemon's fd count to return to {baseline_fds} (now {fds()})")
    wait_until(lambda: tasks() <= baseline_tasks,
               what=f"the daemon's thread count to return to {baseline_tasks} (now {tasks()})")
    assert segments_of(pid) == []
    wait_until(lambda: _shm_mappings(pid) == 0, what="the daemon to unmap its segments")


def test_no_threads_or_mappings_left_in_the_client_process(daemon):
    # The Python threads this test started, and the process's task count at
    # most the baseline: an earlier test's thread may end meanwhile, which
    # lowers the counts for good; a leak can only raise them.
    def left() -> tuple[set[threading.Thread], bool, int]:
        return (set(threading.enumerate()) - threads_before,
                _count("/proc/self/task") <= tasks_before, _shm_mappings("self"))

    _cycle(daemon)  # warm-up
    gc.collect()
    wait_until(lambda: _shm_mappings("self") == 0, what="the warm-up's mapping to go")
    threads_before, tasks_before = set(threading.enumerate()), _count("/proc/self/task")
    with daemon.connect() as client:
        # a connected client runs a heartbeat thread and libzmq's I/O threads
        assert set(threading.enumerate()) - threads_before
        assert _count("/proc/self/task") > tasks_before
        env = client.make("Pendulum-v1", 3, seed=1)
        env.reset()
        assert _shm_mappings("self") == 1
    assert env.closed
    del env
    for _ in range(10):
        _cycle(daemon, "MountainCar-v0", 2)
    gc.collect()
    wait_until(lambda: left() == (set(), True, 0),
               what=f"no thread or mapping left (left: {left()})")


if __name__ == "__main__":
    worker_main(sys.argv[1], int(sys.argv[2]))
