"""``envd bench --python``: gymnasium's own Python envs hosted by envd, against
the other ways to step them, side by side in one run.

For Acrobot-v1 (a costly step) and CartPole-v1 (a cheap one), and where
mujoco is installed (the ``mujoco`` extra) gymnasium's HalfCheetah-v5,
Hopper-v5 and Humanoid-v5 (physics in C), N = 16 envs (``--num-envs``),
every system below steps the env with the same pre-drawn actions:

  - envd in-process with 2 worker processes (``envd.make("py:<id>", N,
    num_workers=2)``), with none (``num_workers=0``: stepped in the caller)
    and with the default count (``default_num_workers``);
  - envd in-process with 1 worker, and through a daemon the benchmark
    starts (``--python-env`` of every id) with 2 workers and with 1
    (``client.make("py:<id>", N, num_workers=...)``: the daemon with 1
    worker against in-process with 1 is the like-for-like comparison of a
    2-CPU machine, DESIGN.md section 14);
  - EnvPool with 2 threads (its own C++ MuJoCo and classic-control envs,
    ``pip install envpool``), the native peer of the same CPUs;
  - the machine's parallel ceiling: two independent processes, each stepping
    a gymnasium SyncVectorEnv of N/2 at the same time, their steps/s summed
    (what two CPUs can do with no coordination at all);
  - gymnasium's SyncVectorEnv and AsyncVectorEnv(shared_memory=True);
  - PufferLib's Multiprocessing backend over its gymnasium emulation, 2
    workers (``pip install pufferlib-core``);
  - Stable-Baselines3's SubprocVecEnv (one process per env, its design).

The MuJoCo envs skip the last three (AsyncVectorEnv, PufferLib, SB3: one
process per env, or not the peer those envs are judged against).

plus the round trip of one step at N=1 through the daemon to a hosted
CartPole-v1 (p50/p99), next to the same env in-process.  A peer that is not
installed gives an ``n/a`` row with the reason.

It is built on ``envd bench``'s method (bench_rounds.py, bench_load.py):
the systems of one env are measured round by round (each once per round, in
a shuffled order, the garbage collector paused), each figure is the median
over rounds with half the min-max range, ratios are taken round by round, a
target whose spread is wider than its margin is NOT JUDGED, and the report
warns when other processes loaded the machine.  It writes results.json,
results.csv, report.txt, readme_table.md (the README's table) and
python_envs.png (drawn from results.json) into ``--out``.
"""
from __future__ import annotations

import contextlib
import csv
import dataclasses
import functools
import gc
import importlib.util
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

import numpy as np

import envd
from envd.tools import bench_load, bench_teardown
from envd.tools.bench import (
    Progress,
    SyncRun,
    Unavailable,
    _die_with_parent,
    _jsonable,
    latency_rounds,
    load_text,
    machine_info,
    steps_per_second,
    usable_cpus,
)
from envd.tools.bench_rounds import interleaved_rounds, judge, paired_ratios, rate_text, ratio_text, spread, spread_text

CLASSIC_ENVS = ("Acrobot-v1", "CartPole-v1")
#: gymnasium's MuJoCo envs, measured where mujoco imports
MUJOCO_ENVS = ("HalfCheetah-v5", "Hopper-v5", "Humanoid-v5")
ENVS = CLASSIC_ENVS + (MUJOCO_ENVS if importlib.util.find_spec("mujoco") else ())
NUM_ENVS = 16
WORKERS = 2
#: The N=1 round trip is timed on the cheapest env: what is left is envd's cost.
LATENCY_ENV = "CartPole-v1"
#: PufferLib's workers busy-poll their flags for 0.5 s after their last
#: command before they start sleeping 10 ms at a time; a measurement of the
#: next system waits this long so that it does not share the CPUs with them.
PUFFER_SETTLE_SECONDS = 0.6

ROW_WORKERS = f"envd in-process, {WORKERS} workers"
ROW_SERIAL = "envd in-process, 0 workers"
ROW_DEFAULT = "envd in-process, default workers"
ROW_DAEMON = f"envd daemon, {WORKERS} workers"
ROW_ONE = "envd in-process, 1 worker"
ROW_DAEMON_ONE = "envd daemon, 1 worker"
ENVPOOL = f"EnvPool, {WORKERS} threads"
CEILING = "parallel ceiling"
GYM_SYNC = "gymnasium SyncVectorEnv"
GYM_ASYNC = "gymnasium AsyncVectorEnv"
PUFFER = "PufferLib Multiprocessing"
SB3 = "SB3 SubprocVecEnv"
#: The rows of the table, in print order.
SYSTEMS = (ROW_WORKERS, ROW_SERIAL, ROW_DEFAULT, ROW_ONE, ROW_DAEMON, ROW_DAEMON_ONE, ENVPOOL,
           CEILING, GYM_SYNC, GYM_ASYNC, PUFFER, SB3)
#: The systems not measured on the MuJoCo envs (their cells say why).
NOT_ON_MUJOCO = {GYM_ASYNC: "not measured on MuJoCo envs (one process per env)",
                 PUFFER: "not measured on MuJoCo envs", SB3: "not measured on MuJoCo envs"}
#: What each row is, for the report and the README.
DESCRIPTIONS = {
    ROW_WORKERS: f'envd.make("py:<id>", N, num_workers={WORKERS})',
    ROW_SERIAL: 'envd.make("py:<id>", N, num_workers=0): stepped in the caller',
    ROW_DEFAULT: 'envd.make("py:<id>", N): num_workers=None, the default rule',
    ROW_ONE: 'envd.make("py:<id>", N, num_workers=1)',
    ROW_DAEMON: f'client.make("py:<id>", N, num_workers={WORKERS}), daemon --python-env <id>',
    ROW_DAEMON_ONE: 'client.make("py:<id>", N, num_workers=1), daemon --python-env <id>',
    ENVPOOL: f"envpool.make(<id>, 'gymnasium', num_envs=N, num_threads={WORKERS}): its own "
             "C++ env",
    CEILING: "2 processes, each a SyncVectorEnv of N/2, stepping at once (summed)",
    GYM_SYNC: 'gymnasium.make_vec(<id>, N, vectorization_mode="sync")',
    GYM_ASYNC: "AsyncVectorEnv(shared_memory=True): one process per env",
    PUFFER: f"pufferlib.vector.Multiprocessing, {WORKERS} workers, batch N "
            "(gymnasium emulation)",
    SB3: "stable_baselines3 SubprocVecEnv: one process per env",
}
LATENCY_SYSTEMS = ("envd daemon, 1 worker", "envd in-process, 1 worker",
                   "envd in-process, 0 workers")


@dataclasses.dataclass
class Settings:
    seconds: float = 1.0          # per measurement
    rounds: int = 5
    num_envs: int = NUM_ENVS      # even: the ceiling's two processes step N/2 each
    out: str | None = None        # None: ./envd-bench-python-<timestamp>
    progress: bool = True
    latency_steps: int = 3000     # timed steps per latency row, over all rounds

    @classmethod
    def quick(cls, **overrides: Any) -> Settings:
        """Settings that finish in about a minute on a 2-core machine."""
        values: dict[str, Any] = {"seconds": 0.1, "rounds": 2, "latency_steps": 300}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def check_num_envs(n: int) -> int:
    """--num-envs: even and >= 2 (the ceiling splits N in two), a multiple of
    the worker count (PufferLib gives each worker N / workers envs)."""
    if n < 2 or n % 2 or n % WORKERS:
        raise ValueError(f"--num-envs must be even, >= 2 and a multiple of {WORKERS}, not {n}")
    return n


# ---- the systems --------------------------------------------------------------------------
def batch_of_actions(space: Any, n: int, seed: int = 0) -> np.ndarray:
    """n actions of one env's action space, drawn once from a generator
    seeded with `seed`: every system steps an env with the same actions (env
    i always gets the i-th), and drawing costs nothing inside the timed
    loop."""
    space.seed(seed)
    return np.array([space.sample() for _ in range(n)])


def env_actions(env_id: str, n: int) -> np.ndarray:
    """batch_of_actions of env_id's action space (gymnasium's own env)."""
    import gymnasium as gym
    env = gym.make(env_id)
    try:
        return batch_of_actions(env.action_space, n)
    finally:
        env.close()


def process_cpu_seconds(pid: int) -> float:
    """CPU seconds of every thread of process pid so far (schedstat's
    nanoseconds; 0 once it is gone)."""
    total = 0
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError, IndexError):
                total += int((task / "schedstat").read_text().split()[0])
    except OSError:
        return 0.0
    return total / 1e9


class CpuTimedRun(SyncRun):
    """A SyncRun whose rate() also records, per round, the CPU time per env
    step of this process (the caller: its step calls, waits and results;
    every thread, EnvPool's too) and of the env's worker processes
    (``worker_pids``, envd in-process), in us: cpu_rounds, [(caller,
    workers)].  Only where that is all the env's CPU (cpu_complete): not a
    daemon's env, nor one whose processes are not known."""

    cpu_complete = True

    def __init__(self, env: Any, num_envs: int, envpool: bool = False):
        super().__init__(env, num_envs, envpool)
        self.cpu_rounds: list[tuple[float, float]] = []

    def rate(self, seconds: float) -> float:
        step, actions, clock = self.env.step, self.actions, time.perf_counter
        step(actions)  # warm up
        pids = list(getattr(self.env, "worker_pids", None) or ())
        workers = sum(process_cpu_seconds(pid) for pid in pids)
        cpu, calls, start = time.process_time(), 0, clock()
        deadline = start + seconds
        while True:
            step(actions)
            calls += 1
            now = clock()
            if now >= deadline:
                break
        cpu = time.process_time() - cpu
        workers = sum(process_cpu_seconds(pid) for pid in pids) - workers
        per_step = 1e6 / (calls * self.num_envs)
        self.cpu_rounds.append((cpu * per_step, workers * per_step))
        return calls * self.num_envs / (now - start)


class VectorRun(CpuTimedRun):
    """Steps a gymnasium-style VectorEnv it owns (envd's, gymnasium's):
    reset(seed=0), then step(actions) (None: batch_of_actions of its single
    action space); rate (with its CPU time: cpu_complete says whether it is
    all of it), call_times and close are CpuTimedRun's."""

    def __init__(self, env: Any, num_envs: int, actions: np.ndarray | None = None,
                 label: str | None = None, cpu_complete: bool = True):
        self.env, self.num_envs = env, num_envs
        self.actions = batch_of_actions(env.single_action_space, num_envs) \
            if actions is None else actions
        env.reset(seed=0)
        self.label = label  # e.g. the worker count the default rule picked
        self.cpu_complete = cpu_complete
        self.cpu_rounds = []


class PufferRun:
    """PufferLib's Multiprocessing backend, synchronous (batch_size N): each
    step sends the actions and waits for every worker."""

    def __init__(self, env_id: str, num_envs: int, workers: int):
        try:
            import pufferlib.emulation
            import pufferlib.vector
        except Exception as exc:  # noqa: BLE001  (ImportError, or a broken build)
            raise Unavailable(f"pufferlib not installed (pip install 'envd-rl[bench]'): "
                              f"{exc}") from None
        import gymnasium as gym
        creator = functools.partial(pufferlib.emulation.GymnasiumPufferEnv,
                                    env_creator=gym.make, env_args=[env_id])
        # overwork: PufferLib refuses more workers than physical cores, which
        # a 2-vCPU VM may count as 1; the comparison is at the same count.
        self.env = pufferlib.vector.make(creator, backend=pufferlib.vector.Multiprocessing,
                                         num_envs=num_envs, num_workers=workers,
                                         batch_size=num_envs, overwork=True)
        self.num_envs = num_envs
        try:
            # (its Discrete actions travel as int32)
            self.actions = env_actions(env_id, num_envs).astype(np.int32)
            self.env.reset(seed=0)
        except BaseException:
            self.close()
            raise
        self._settle()

    def _settle(self) -> None:
        time.sleep(PUFFER_SETTLE_SECONDS)  # its workers stop busy-polling

    def rate(self, seconds: float) -> float:
        env, actions = self.env, self.actions
        try:
            return steps_per_second(lambda: env.step(actions), self.num_envs, seconds)
        finally:
            self._settle()

    def close(self) -> None:
        self.env.close()  # terminates its worker processes
        for proc in self.env.processes:
            proc.join(30)


class SB3Run:
    """Stable-Baselines3's SubprocVecEnv: one process per env, pipes."""

    def __init__(self, env_id: str, num_envs: int):
        try:
            from stable_baselines3.common.vec_env import SubprocVecEnv
        except Exception as exc:  # noqa: BLE001
            raise Unavailable(f"stable-baselines3 not installed (pip install "
                              f"'envd-rl[bench]'): {exc}") from None
        import gymnasium as gym
        self.env = SubprocVecEnv([functools.partial(gym.make, env_id)] * num_envs,
                                 start_method="forkserver")
        self.num_envs = num_envs
        self.actions = env_actions(env_id, num_envs)
        self.env.seed(0)
        self.env.reset()

    def rate(self, seconds: float) -> float:
        env, actions = self.env, self.actions
        return steps_per_second(lambda: env.step(actions), self.num_envs, seconds)

    def close(self) -> None:
        self.env.close()


class CeilingRun:
    """The machine's parallel ceiling: `processes` processes, each stepping a
    gymnasium SyncVectorEnv of num_envs / processes, started on one clock and
    stepping until the same end; the sum of their rates, each over the time
    it stepped (a process that a loaded machine woke late still counts at
    its own rate, and every process steps at least once).  Nothing is
    shared between them: no coordination can do better."""

    def __init__(self, env_id: str, num_envs: int, processes: int = WORKERS):
        context = multiprocessing.get_context("forkserver")
        self.members: list[tuple[Any, Any]] = []
        actions = env_actions(env_id, num_envs)
        share = num_envs // processes
        try:
            for p in range(processes):
                parent, child = context.Pipe()
                proc = context.Process(target=ceiling_process, daemon=True,
                                       args=(env_id, actions[p * share:(p + 1) * share], child))
                proc.start()
                child.close()
                self.members.append((proc, parent))
            for _, conn in self.members:
                if not conn.poll(120):
                    raise RuntimeError("a ceiling process did not start")
                kind, value = conn.recv()
                if kind == "error":
                    raise RuntimeError(f"a ceiling process failed: {value}")
        except BaseException:
            self.close()
            raise

    def rate(self, seconds: float) -> float:
        start = time.monotonic() + 0.05  # CLOCK_MONOTONIC: one clock for all processes
        for _, conn in self.members:
            conn.send((start, start + seconds))
        replies = [conn.recv() for _, conn in self.members]
        return sum(steps / (end - began) for steps, began, end in replies)

    def close(self) -> None:
        for _proc, conn in self.members:
            with contextlib.suppress(OSError, ValueError):
                conn.send(None)
        for proc, conn in self.members:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
                proc.join()
            conn.close()
        self.members = []


def ceiling_process(env_id: str, actions: np.ndarray, conn: Any) -> None:
    """One process of the ceiling: make a SyncVectorEnv of len(actions)
    envs, say ("ready", None) or ("error", why), then for each (start, end)
    from the parent step from start (or now, if later) until end
    (time.monotonic values), at least once, and reply (env steps, when it
    began, when it ended); None ends it."""
    n = len(actions)
    try:
        import gymnasium as gym
        env = gym.make_vec(env_id, num_envs=n, vectorization_mode="sync")
        env.reset(seed=0)
    except Exception as exc:  # noqa: BLE001  (reported to the parent, which raises)
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", None))
    try:
        while (window := conn.recv()) is not None:
            start, end = window
            env.step(actions)
            time.sleep(max(0.0, start - time.monotonic() - 0.002))
            while time.monotonic() < start:  # the last 2 ms spinning: start on time
                pass
            steps, began = 0, time.monotonic()
            gc.disable()
            while True:
                env.step(actions)
                steps += n
                now = time.monotonic()
                if now >= end:
                    break
            gc.enable()
            conn.send((steps, began, now))
    except EOFError:
        pass
    finally:
        env.close()


def _gym_vector(env_id: str, n: int, mode: str) -> VectorRun:
    import gymnasium as gym
    kwargs: dict[str, Any] = ({"vector_kwargs": {"shared_memory": True,
                                                  "context": "forkserver"}}
                              if mode == "async" else {})
    return VectorRun(gym.make_vec(env_id, num_envs=n, vectorization_mode=mode, **kwargs), n,
                     env_actions(env_id, n), cpu_complete=mode == "sync")


def _envd_default(env_id: str, n: int) -> VectorRun:
    env = envd.make("py:" + env_id, n, seed=0)
    return VectorRun(env, n, env_actions(env_id, n), label=f"{env.num_workers} workers")


def _daemon_run(client: Any, env_id: str, n: int, workers: int = WORKERS) -> VectorRun:
    env = client.make("py:" + env_id, n, seed=0, num_workers=workers)
    return VectorRun(env, n, env_actions(env_id, n),
                     label=_path_name(getattr(env, "fast_path", None)),
                     cpu_complete=False)  # (the daemon's CPU is not counted)


def _path_name(fast_path: bool | None) -> str:
    """Which way a daemon env's steps go: the report says it."""
    return {True: "fast path", False: "socket path", None: "unknown path"}[fast_path]


def _envpool_run(env_id: str, n: int) -> SyncRun:
    try:
        import envpool
    except Exception as exc:  # noqa: BLE001  (ImportError, or a broken build)
        raise Unavailable(f"envpool not installed (pip install 'envd-rl[bench]'): "
                          f"{exc}") from None
    if env_id not in envpool.list_all_envs():
        raise Unavailable(f"envpool {envpool.__version__} has no {env_id}")
    run = CpuTimedRun(envpool.make(env_id, env_type="gymnasium", num_envs=n, batch_size=n,
                                   num_threads=WORKERS, seed=0), n, envpool=True)
    # the same actions as every other system's, in EnvPool's action dtype
    run.actions = env_actions(env_id, n).astype(run.actions.dtype)
    return run


def factories(env_id: str, n: int, client: Any) -> dict[str, Callable[[], Any]]:
    """system -> a factory of its run object, for one env (a MuJoCo env's
    leave out NOT_ON_MUJOCO)."""
    made = {
        ROW_WORKERS: lambda: VectorRun(envd.make("py:" + env_id, n, seed=0,
                                                  num_workers=WORKERS), n, env_actions(env_id, n)),
        ROW_SERIAL: lambda: VectorRun(envd.make("py:" + env_id, n, seed=0, num_workers=0), n,
                                      env_actions(env_id, n)),
        ROW_DEFAULT: lambda: _envd_default(env_id, n),
        ROW_ONE: lambda: VectorRun(envd.make("py:" + env_id, n, seed=0, num_workers=1), n,
                                   env_actions(env_id, n)),
        ROW_DAEMON: lambda: _daemon_run(client, env_id, n),
        ROW_DAEMON_ONE: lambda: _daemon_run(client, env_id, n, 1),
        ENVPOOL: lambda: _envpool_run(env_id, n),
        CEILING: lambda: CeilingRun(env_id, n),
        GYM_SYNC: lambda: _gym_vector(env_id, n, "sync"),
        GYM_ASYNC: lambda: _gym_vector(env_id, n, "async"),
        PUFFER: lambda: PufferRun(env_id, n, WORKERS),
        SB3: lambda: SB3Run(env_id, n),
    }
    if env_id in MUJOCO_ENVS:
        for system, why in NOT_ON_MUJOCO.items():
            made[system] = functools.partial(_not_measured, why)
    return made


def _not_measured(why: str) -> Any:
    raise Unavailable(why)


# ---- the daemon ---------------------------------------------------------------------------
def wait_for_daemon(proc: subprocess.Popen, endpoint: str, seconds: float = 120) -> Any:
    """A client of the daemon at endpoint, once it answers; RuntimeError when
    it exits first or does not answer within `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return envd.connect(endpoint, timeout=5)
        except envd.EnvdError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the daemon at {endpoint} did not start "
                                   f"(exit status {proc.poll()})") from None
            time.sleep(0.1)


@contextlib.contextmanager
def hosting_daemon(env_ids: tuple[str, ...], threads: int | None = 1,
                   quiet: bool = True, extra_args: tuple[str, ...] = ()) -> Iterator[Any]:
    """A private daemon (ipc endpoint in a temporary directory) allowed to
    host env_ids (``--python-env``), with `threads` threads (None: its
    default) and extra_args on its command line; yields a client of it, and
    stops the daemon (SIGTERM, then SIGKILL after 30 s) and removes the
    directory on exit.  The daemon dies with this process (PR_SET_PDEATHSIG) and ignores
    the caller's ENVD_* settings."""
    with bench_teardown.temporary_folder("envd-bench-python-") as folder:
        endpoint = f"ipc://{folder}/envd.sock"
        args = [sys.executable, "-m", "envd", "--bind", endpoint, "--log-level", "warning",
                *(() if threads is None else ("--threads", str(threads))), *extra_args]
        for env_id in env_ids:
            args += ["--python-env", env_id]
        environ = {k: v for k, v in os.environ.items() if not k.startswith("ENVD_")}
        sink = subprocess.DEVNULL if quiet else None
        proc = subprocess.Popen(args, cwd=folder, stdin=subprocess.DEVNULL, stdout=sink,
                                stderr=sink, env=environ,
                                preexec_fn=_die_with_parent)
        try:
            with bench_teardown.daemon(proc), wait_for_daemon(proc, endpoint) as client:
                yield client
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# ---- measuring ----------------------------------------------------------------------------
class PythonBench:
    """One run; measure() needs a client of a daemon hosting ENVS."""

    def __init__(self, settings: Settings, out: TextIO | None = None):
        self.settings = settings
        self.out = sys.stdout if out is None else out
        self.progress = Progress(0, enabled=False)

    def measure_env(self, env_id: str, client: Any,
                    make: Callable[[str, int, Any], dict[str, Callable[[], Any]]] = factories,
                    ) -> dict[str, Any]:
        """Every system on one env: {"rounds": {system: [steps/s per round]},
        "missing": {system: why}, "labels": {system: note}}."""
        s = self.settings
        runs: dict[str, Any] = {}
        missing: dict[str, str] = {}
        try:
            for system, factory in make(env_id, s.num_envs, client).items():
                self.progress.show(f"{env_id}: starting {system}")
                try:
                    runs[system] = factory()
                except Unavailable as exc:
                    missing[system] = str(exc)
                except Exception as exc:
                    if system.startswith("envd"):
                        raise  # envd itself failing is not a benchmark result
                    missing[system] = f"{type(exc).__name__}: {exc}"
            self.progress.advance(s.rounds * len(missing))

            def measure(system: str, round_index: int) -> float:
                self.progress.show(f"{env_id} {system} (round {round_index + 1}/{s.rounds})")
                gc.disable()
                try:
                    return runs[system].rate(s.seconds)
                finally:
                    gc.enable()
                    self.progress.advance()

            rounds = interleaved_rounds(list(runs), s.rounds, measure)
            labels = {system: run.label for system, run in runs.items()
                      if getattr(run, "label", None)}
            cpu = {system: [list(r) for r in run.cpu_rounds] for system, run in runs.items()
                   if getattr(run, "cpu_complete", False) and run.cpu_rounds}
        finally:
            for run in runs.values():
                run.close()
        return {"rounds": rounds, "missing": missing, "labels": labels, "cpu_us": cpu}

    def measure_latency(self, client: Any) -> dict[str, Any]:
        """Round trip of one step of one hosted env (us, p50/p99): through
        the daemon (1 worker), and in-process with 1 worker and with none."""
        s = self.settings
        env_id = "py:" + LATENCY_ENV
        makers = {
            LATENCY_SYSTEMS[0]: lambda: client.make(env_id, 1, seed=0, num_workers=1),
            LATENCY_SYSTEMS[1]: lambda: envd.make(env_id, 1, seed=0, num_workers=1),
            LATENCY_SYSTEMS[2]: lambda: envd.make(env_id, 1, seed=0, num_workers=0),
        }
        runs: dict[str, VectorRun] = {}
        per_round = max(10, s.latency_steps // s.rounds)
        try:
            for name, make in makers.items():
                runs[name] = VectorRun(make(), 1)
            measured = latency_rounds(runs, s.rounds, per_round, self.progress)
            path = getattr(runs[LATENCY_SYSTEMS[0]].env, "fast_path", None)
        finally:
            for run in runs.values():
                run.close()
        return {"env_id": env_id, "daemon_path": _path_name(path), **measured}

    def run(self) -> dict[str, Any]:
        s = self.settings
        machine = machine_info()
        machine["versions"].update(peer_versions())
        print(machine_text(machine, s), file=self.out, flush=True)
        total = (len(ENVS) * len(SYSTEMS) + len(LATENCY_SYSTEMS)) * s.rounds
        self.progress = Progress(total, enabled=s.progress)
        before = bench_load.sample()
        try:
            self.progress.show("starting the daemon")
            with hosting_daemon(ENVS) as client:
                envs = {env_id: self.measure_env(env_id, client) for env_id in ENVS}
                latency = self.measure_latency(client)
        finally:
            self.progress.close()
        after = bench_load.sample()
        machine["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
        machine["load"] = (bench_load.assess(before, after, usable_cpus()).as_dict()
                           if before and after else None)
        return assemble(machine, s, envs, latency)


def peer_versions() -> dict[str, str | None]:
    """Versions of the peers this comparison uses (None: not installed)."""
    from importlib import metadata
    found: dict[str, str | None] = {}
    for name in ("pufferlib-core", "stable-baselines3", "envpool", "mujoco"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def machine_text(m: dict[str, Any], s: Settings) -> str:
    v = m["versions"]
    peers = ", ".join(f"{k} {v.get(k) or 'not installed'}"
                      for k in ("gymnasium", "mujoco", "envpool", "pufferlib-core",
                                "stable-baselines3"))
    load = " ".join(f"{x:.2f}" for x in m["load_average"])
    return (f"envd bench --python  {m['time']}  host {m['hostname']}\n"
            f"CPU: {m['cpu']}, {m['cores']} cores ({m['usable_cpus']} usable), "
            f"load average {load}\n"
            f"envd {v['envd']}, Python {v['python']}, numpy {v['numpy']}, {peers}\n"
            f"N={s.num_envs} envs per system; each system: {s.rounds} rounds of {s.seconds:g} s, "
            f"interleaved (every system once per round, shuffled), gc paused;\n"
            f"figures are medians over rounds, '±' half the min-max range over rounds "
            f"(relative to the median for rates)")


# ---- results ------------------------------------------------------------------------------
def assemble(machine: dict[str, Any], s: Settings, envs: dict[str, dict[str, Any]],
             latency: dict[str, Any]) -> dict[str, Any]:
    """The results: per env, each system's rounds and median (or why it is
    missing); the latency rows; the targets."""
    table = {}
    for env_id, entry in envs.items():
        cells: dict[str, float | str] = {}
        for system in SYSTEMS:
            if system in entry["rounds"]:
                cells[system] = spread(entry["rounds"][system]).median
            else:
                cells[system] = "n/a: " + entry["missing"].get(system, "not measured")
        table[env_id] = {"cells": cells, "rounds": entry["rounds"],
                         "labels": entry.get("labels", {}), "cpu_us": entry.get("cpu_us", {})}
    results = {"machine": machine, "settings": dataclasses.asdict(s), "num_envs": s.num_envs,
               "workers": WORKERS, "envs": list(envs), "systems": list(SYSTEMS),
               "descriptions": DESCRIPTIONS, "table": table, "latency_us": latency}
    results["targets"] = targets(results)
    return results


#: (env, system, base, op, limit): "system >= limit x base" on env, ratios round by round.
TARGETS = (
    ("Acrobot-v1", ROW_WORKERS, CEILING, ">=", 0.85),
    ("Acrobot-v1", ROW_WORKERS, GYM_ASYNC, ">=", 2.0),
    ("Acrobot-v1", ROW_WORKERS, PUFFER, ">=", 1.2),
    ("Acrobot-v1", ROW_DAEMON, ROW_WORKERS, ">=", 0.8),
    ("CartPole-v1", ROW_DEFAULT, GYM_SYNC, ">=", 0.95),
    ("Acrobot-v1", ROW_DEFAULT, GYM_SYNC, ">=", 0.95),
    # issue 37: the hosted step loop at the env's own cost, and its peers
    ("Acrobot-v1", ROW_WORKERS, GYM_SYNC, ">=", 1.6),
    ("Acrobot-v1", ROW_DAEMON_ONE, ROW_ONE, ">=", 0.9),
    *((env_id, ROW_SERIAL, GYM_SYNC, ">=", 0.95) for env_id in MUJOCO_ENVS),
    *((env_id, ROW_WORKERS, ENVPOOL, ">=", 1.0) for env_id in ("HalfCheetah-v5", "Humanoid-v5")),
    ("HalfCheetah-v5", ROW_DAEMON_ONE, ROW_ONE, ">=", 0.9),
)


def targets(r: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets of issues 17 and 37, each a ratio of two systems of one env taken
    round by round and judged (PASS, FAIL, NOT JUDGED, N/A with the reason):
    {target, status, value, spread, margin, op, limit, detail}."""
    found = []
    for env_id, system, base, op, limit in TARGETS:
        name = f"{env_id} N={r['num_envs']}: {system} {op} {limit:g}x {base}"
        entry = r["table"].get(env_id)
        if entry is None:
            found.append({"target": name, **judge(None, op, limit), "op": op, "limit": limit,
                          "detail": f"{env_id} not measured"})
            continue
        a, b = entry["rounds"].get(system), entry["rounds"].get(base)
        ratio = paired_ratios(a, b) if a and b else None
        if ratio:
            detail = f"{spread_text(a)} / {spread_text(b)} = {ratio_text(ratio)}"
        else:
            detail = "; ".join(str(entry["cells"][x])[5:] for x in (system, base)
                               if not (entry["rounds"].get(x))) or "not measured"
        found.append({"target": name, **judge(ratio, op, limit), "op": op, "limit": limit,
                      "detail": detail})
    return found


def _cell_text(entry: dict[str, Any], system: str) -> str:
    values = entry["rounds"].get(system)
    return spread_text(values) if values else "n/a"


def _row_label(r: dict[str, Any], system: str) -> str:
    """The row's name, with its note per env (the default rule's pick, the daemon's path)."""
    picked = {env_id: r["table"][env_id]["labels"][system] for env_id in r["envs"]
              if system in r["table"][env_id].get("labels", {})}
    if not picked:
        return system
    if len(picked) == len(r["envs"]) and len(set(picked.values())) == 1:
        return f"{system} ({next(iter(picked.values()))})"
    return f"{system} ({'; '.join(f'{e}: {label}' for e, label in picked.items())})"


COLUMN = 16


def report(r: dict[str, Any]) -> str:
    """The printed report: the table, ratios to SyncVectorEnv, the latency, the targets."""
    lines = [f"\n{load_text(r['machine'])}" if "machine" in r else "",
             f"\nenv steps per second, N={r['num_envs']} (median of rounds, ± half their range)",
             f"{'system':<34}" + "".join(f"{env_id:>{COLUMN}}" for env_id in r["envs"])]
    for system in r["systems"]:
        lines.append(f"{system:<34}" + "".join(
            f"{_cell_text(r['table'][env_id], system):>{COLUMN}}" for env_id in r["envs"]))
    for system in r["systems"]:
        for env_id in r["envs"]:
            entry = r["table"][env_id]
            if system in entry.get("labels", {}):
                lines.append(f"  {system} on {env_id}: {entry['labels'][system]}")
            cell = entry["cells"][system]
            if isinstance(cell, str) and system not in entry["rounds"]:
                lines.append(f"  n/a {system} on {env_id}: {cell[5:]}")
    lines.append(f"\nratio to {GYM_SYNC} (round by round)")
    for system in r["systems"]:
        row = []
        for env_id in r["envs"]:
            entry = r["table"][env_id]
            a, b = entry["rounds"].get(system), entry["rounds"].get(GYM_SYNC)
            ratio = paired_ratios(a, b) if a and b else None
            row.append(ratio_text(ratio) if ratio else "-")
        lines.append(f"{system:<34}" + "".join(f"{x:>{COLUMN}}" for x in row))
    lines.extend(cpu_lines(r))
    lat = r["latency_us"]
    lines.append(f"\nround trip of one step, N=1, hosted {lat['env_id']} (us; the daemon "
                 f"took its {lat['daemon_path']})")
    for name in LATENCY_SYSTEMS:
        value = lat.get(name)
        if isinstance(value, dict):
            lines.append(f"  {name:<28} p50 {value['p50']:8.1f}   p99 {value['p99']:8.1f}")
    lines.append("\ntargets (PASS/FAIL; NOT JUDGED: the spread over rounds is wider than the "
                 "margin to the target)")
    for target in r["targets"]:
        lines.append(f"  {target['status']:<10}  {target['target']}: {target['detail']}")
    lines.append("\nsystems:")
    for system in r["systems"]:
        lines.append(f"  {system:<32}  {r['descriptions'][system]}")
    if "machine" in r and (r["machine"].get("load") or {}).get("reasons"):
        lines.append(f"\n{load_text(r['machine'])}")  # again, next to the verdicts
    return "\n".join(line for line in lines if line != "")


def cpu_cells(r: dict[str, Any]) -> dict[str, list[str]]:
    """The CPU-time cells: per system (the rows whose every process is
    counted) and env, the CPU us per env step of the caller + its workers
    (medians over rounds) and the total's ratio to SyncVectorEnv's (round
    by round), "-" where not measured.  Preemptions do not count in CPU
    time, so a loaded machine distorts it far less than the rates: workers
    whose sum is near 1.00x step at the env's own cost, and the caller's
    share is what envd adds on the step's critical path."""
    found: dict[str, list[str]] = {}
    for system in r["systems"]:
        if not any(system in r["table"][e].get("cpu_us", {}) for e in r["envs"]):
            continue
        cells = found[system] = []
        for env_id in r["envs"]:
            cpu = r["table"][env_id].get("cpu_us", {})
            own, base = cpu.get(system), cpu.get(GYM_SYNC)
            if not own:
                cells.append("-")
                continue
            caller = float(np.median([c for c, _ in own]))
            workers = float(np.median([w for _, w in own]))
            text = f"{caller:.1f}+{workers:.1f}" if workers else f"{caller:.1f}"
            if base and len(base) == len(own):
                ratio = np.median([(c + w) / (bc + bw) for (c, w), (bc, bw) in zip(own, base)])
                text += f" {ratio:.2f}x"
            cells.append(text)
    return found


CPU_TITLE = "CPU time per env step, us (median of rounds): caller + workers"


def cpu_lines(r: dict[str, Any]) -> list[str]:
    """The report's CPU-time section (cpu_cells)."""
    cells = cpu_cells(r)
    if not cells:
        return []
    lines = [f"\n{CPU_TITLE}, x {GYM_SYNC}'s total (round by round; the rows whose every "
             f"process is counted)"]
    for system, row in cells.items():
        lines.append(f"{system:<34}" + "".join(f"{x:>{COLUMN + 6}}" for x in row))
    return lines


def readme_table(r: dict[str, Any]) -> str:
    """The README's Markdown table (steps/s with spread, and x SyncVectorEnv)
    and its latency line."""
    head = "| system (N={}) | {} |".format(
        r["num_envs"], " | ".join(f"{e} steps/s | x Sync" for e in r["envs"]))
    lines = [head, "|---" * (1 + 2 * len(r["envs"])) + "|"]
    for system in r["systems"]:
        cells = []
        for env_id in r["envs"]:
            entry = r["table"][env_id]
            a, b = entry["rounds"].get(system), entry["rounds"].get(GYM_SYNC)
            ratio = paired_ratios(a, b) if a and b else None
            cells += [_cell_text(entry, system), f"{spread(ratio).median:.2f}x" if ratio else "-"]
        lines.append(f"| {_row_label(r, system)} | " + " | ".join(cells) + " |")
    lat = r["latency_us"]
    parts = [f"{name} p50 {lat[name]['p50']:.0f} us (p99 {lat[name]['p99']:.0f} us)"
             for name in LATENCY_SYSTEMS if isinstance(lat.get(name), dict)]
    lines.append("")
    lines.append(f"One step of one hosted {lat['env_id']} (N=1): " + "; ".join(parts)
                 + f" (the daemon: its {lat['daemon_path']}).")
    cpu_rows = cpu_cells(r)
    if cpu_rows:
        lines += ["", f"{CPU_TITLE}, x SyncVectorEnv's total:", "",
                  f"| system (N={r['num_envs']}) | " + " | ".join(r["envs"]) + " |",
                  "|---" * (1 + len(r["envs"])) + "|"]
        lines += [f"| {system} | " + " | ".join(row) + " |" for system, row in cpu_rows.items()]
    lines.append("")
    lines.extend(f"- {t['status']}: {t['target']} ({t['detail']})" for t in r["targets"])
    return "\n".join(lines) + "\n"


def write_csv(r: dict[str, Any], path: Path) -> None:
    """One line per env and system: the median, min, max and rounds, or why not."""
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["section", "env_id", "system", "num_envs", "value", "min", "max",
                      "rounds", "note"])
        for env_id in r["envs"]:
            entry = r["table"][env_id]
            for system in r["systems"]:
                values = entry["rounds"].get(system)
                if values:
                    s = spread(values)
                    out.writerow(["steps_per_second", env_id, system, r["num_envs"], s.median,
                                  s.low, s.high, s.rounds, entry.get("labels", {}).get(system,
                                                                                        "")])
                else:
                    out.writerow(["steps_per_second", env_id, system, r["num_envs"], "", "", "",
                                  "", entry["cells"][system]])
        lat = r["latency_us"]
        for name in LATENCY_SYSTEMS:
            value = lat.get(name)
            if isinstance(value, dict):
                for pct in ("p50", "p99"):
                    rounds = value[f"{pct}_rounds"]
                    out.writerow([f"latency_us_{pct}", lat["env_id"], name, 1, value[pct],
                                  min(rounds), max(rounds), len(rounds), lat["daemon_path"]])


def plot(results_json: Path, path: Path) -> str | None:
    """Draw python_envs.png from results.json: per env, a horizontal bar of
    each system's median steps/s with its min-max range over rounds.
    Returns the reason when it cannot (matplotlib missing)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except Exception as exc:  # noqa: BLE001
        return f"matplotlib not installed (pip install 'envd-rl[bench]'): {exc}"
    r = json.loads(Path(results_json).read_text())
    fig, axes = plt.subplots(1, len(r["envs"]), figsize=(6 * len(r["envs"]), 5), sharey=True,
                             squeeze=False)
    systems = list(r["systems"])
    for ax, env_id in zip(axes[0], r["envs"]):
        entry = r["table"][env_id]
        medians, low, high, colors = [], [], [], []
        for system in systems:
            values = entry["rounds"].get(system)
            s = spread(values) if values else None
            medians.append(s.median if s else 0.0)
            low.append(s.median - s.low if s else 0.0)
            high.append(s.high - s.median if s else 0.0)
            colors.append("tab:blue" if system.startswith("envd") else
                          "tab:gray" if system == CEILING else "tab:orange")
        y = np.arange(len(systems))
        ax.barh(y, medians, xerr=[low, high], color=colors, capsize=3)
        for i, system in enumerate(systems):
            if not entry["rounds"].get(system):
                ax.text(0, i, "  n/a (not installed)", va="center", fontsize=8)
        ax.set_yticks(y, systems)
        ax.set_title(f"{env_id}, N={r['num_envs']}", fontsize=10)
        ax.set_xlabel("env steps per second (median; bars: min-max over rounds)")
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(
            lambda x, _: rate_text(x) if x else "0"))
        ax.grid(True, axis="x", alpha=0.3)
    axes[0][0].invert_yaxis()  # the table's order, top down (once: the y axis is shared)
    m = r["machine"]
    load = m.get("load") or {}
    fig.suptitle(f"envd bench --python on {m['cpu']} ({m['usable_cpus']} CPUs), "
                 f"{m['time'][:16]}, load average {m['load_average'][0]:.2f}"
                 + (" (a loaded machine: rerun)" if load.get("reasons") else ""), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def write_outputs(r: dict[str, Any], text: str, out: Path) -> list[str]:
    """results.json, results.csv, report.txt, readme_table.md and (from
    results.json) python_envs.png; returns notes."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(_jsonable(r), indent=2) + "\n")
    write_csv(r, out / "results.csv")
    (out / "report.txt").write_text(text + "\n")
    (out / "readme_table.md").write_text(readme_table(r))
    problem = plot(out / "results.json", out / "python_envs.png")
    return [f"no plot: {problem}"] if problem else []


def default_out() -> str:
    return f"envd-bench-python-{time.strftime('%Y%m%d-%H%M%S')}"


def main(settings: Settings, stdout: TextIO | None = None) -> int:
    """Run the comparison, print the report, write the files; exit status 0
    (the targets are reported, not enforced)."""
    stdout = sys.stdout if stdout is None else stdout
    multiprocessing.get_context("forkserver").set_forkserver_preload(["envd", "gymnasium"])
    results = PythonBench(settings, stdout).run()
    text = report(results)
    print(text, file=stdout)
    out = Path(settings.out or default_out())
    for note in write_outputs(results, text, out):
        print(f"\n{note}", file=stdout)
    print(f"\nwrote {out}/results.json, results.csv, report.txt, readme_table.md"
          + (", python_envs.png" if (out / "python_envs.png").exists() else ""), file=stdout)
    return 0


__all__ = ["PythonBench", "Settings", "hosting_daemon", "main", "report", "targets"]
