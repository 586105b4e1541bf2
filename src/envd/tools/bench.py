"""``envd bench``: the whole performance comparison on this machine, in one command.

Starts private daemons (ipc endpoints in a temporary directory; threads 1
and auto, auto being ``--threads``, default the usable CPUs, and two of half
auto each for the comparison over two daemons), then measures
CartPole-v1 env steps per second for N in ``--sizes`` (default 1, 64, 1024,
4096) for:

  - envd in-process (``envd.make(env, N, num_threads=T)``), T = 1 and auto
  - envd through the daemon, socket path (``client.make(env, N, fast_path=False)``)
  - envd fast path (``client.make(env, N, fast_path=True)``); while the client
    has no ``fast_path`` option, or the daemon does not offer it, the row says
    why it is n/a
  - EnvPool sync and async (batch_size N/2, its own recv/send loop), in-process,
    when envpool imports (``pip install 'envd-rl[bench]'``)
  - gymnasium's numpy vector env (``vectorization_mode="vector_entry_point"``)
  - gymnasium's AsyncVectorEnv (one process per env: N <= 64 only)

plus the round-trip latency of one step at N=1 (p50/p99), a sweep of
in-process thread counts 0..CPUs for CartPole-v1 and Acrobot-v1, four
client processes of 1024 envs stepping at once through one daemon versus one
client of 4096, a cheap session capped at max_threads=0 next to a CPU-heavy
one against both uncapped (bench_pair.py), the async-with-learner comparison
(bench_learner.py) and async mode over two daemons of half the threads each
versus one daemon (bench_multi.py).  It
prints the table, ratios and PASS/FAIL/NOT JUDGED target lines, and writes
results.json, results.csv, report.txt, readme_table.md (the README's
benchmark section, bench_readme.py) and steps_per_second.png (matplotlib,
also in the ``bench`` extra) into the output directory.

Machines are noisy (bench_rounds.py, bench_load.py): the configurations
compared are measured round by round (every configuration once per round, in
a shuffled order, the garbage collector paused), the report gives each
one's median and spread over rounds, a target whose spread is wider than its
margin is NOT JUDGED, and the run is flagged when other processes loaded the
machine meanwhile.
"""
from __future__ import annotations

import contextlib
import csv
import ctypes
import dataclasses
import functools
import gc
import inspect
import json
import multiprocessing
import os
import platform
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np

import envd
from envd.tools import bench_learner, bench_load, bench_multi, bench_pair, bench_readme, bench_teardown
from envd.tools.bench_rounds import (
    interleaved_rounds,
    judge,
    paired_ratios,
    rate_text,
    ratio_text,
    spread,
    spread_text,
)

ENV_ID = "CartPole-v1"
SIZES = (1, 64, 1024, 4096)
SWEEP_ENVS = ("CartPole-v1", "Acrobot-v1")
ASYNC_VECTOR_MAX = 64  # gymnasium's AsyncVectorEnv: one process per env
SCALING_CLIENTS, SCALING_ENVS = 4, 1024

#: (system, threads) rows of the main table, in print order; threads "-" where none apply.
ROWS = [("envd in-process", "1"), ("envd in-process", "auto"),
        ("envd daemon socket", "1"), ("envd daemon socket", "auto"),
        ("envd fast path", "1"), ("envd fast path", "auto"),
        ("EnvPool sync", "1"), ("EnvPool sync", "auto"),
        ("EnvPool async", "1"), ("EnvPool async", "auto"),
        ("gymnasium numpy vector", "-"), ("gymnasium AsyncVectorEnv", "-")]


@dataclasses.dataclass
class Settings:
    seconds: float = 0.3           # per measurement (the default run takes ~3 min on 2 cores)
    rounds: int = 7
    sizes: tuple[int, ...] = SIZES
    threads: int | None = None     # the auto daemon's --threads (None: usable CPUs)
    out: str | None = None         # None: ./envd-bench-<timestamp>
    progress: bool = True
    latency_steps: int = 4000      # timed steps per latency row, over all rounds
    scaling_seconds: float = 1.0   # per scaling round and capped-pair round
    learner_envs: int = 4096       # N of the async-with-learner comparison (batch N/2)
    learner_seconds: float = 0.5   # per learner measurement (a ConnectFour sync step: ~40 ms)

    @classmethod
    def quick(cls, **overrides: Any) -> Settings:
        """Settings that finish in about a minute on a 2-core machine."""
        values: dict[str, Any] = {"seconds": 0.03, "rounds": 2, "latency_steps": 400,
                                  "scaling_seconds": 0.2, "learner_envs": 1024,
                                  "learner_seconds": 0.05}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


class Unavailable(Exception):
    """A configuration that cannot be measured here; the message says why."""


class NotApplicable(Exception):
    """A configuration that does not exist at this N (printed as '-')."""


# ---- progress -----------------------------------------------------------------------------
class Progress:
    """A one-line text bar on a terminal: ``[#####.....] 12/48 label``.
    Silent unless enabled and the stream is a tty."""

    WIDTH = 30

    def __init__(self, total: int, stream: TextIO | None = None, enabled: bool = True):
        self.stream = sys.stderr if stream is None else stream
        self.enabled = enabled and _isatty(self.stream)
        self.total, self.done, self._shown = max(total, 1), 0, 0

    def show(self, label: str) -> None:
        if not self.enabled:
            return
        filled = min(self.WIDTH, self.WIDTH * self.done // self.total)
        line = f"\r[{'#' * filled}{'.' * (self.WIDTH - filled)}] {self.done}/{self.total} {label}"
        self.stream.write(line.ljust(self._shown))
        self.stream.flush()
        self._shown = len(line)

    def advance(self, count: int = 1) -> None:
        self.done = min(self.total, self.done + count)

    def close(self) -> None:
        if self.enabled and self._shown:
            self.stream.write("\r" + " " * self._shown + "\r")
            self.stream.flush()
            self._shown = 0


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


# ---- the machine --------------------------------------------------------------------------
def usable_cpus() -> int:
    return len(os.sched_getaffinity(0))


def machine_info() -> dict[str, Any]:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    versions = {"envd": envd.__version__, "python": platform.python_version(),
                "numpy": np.__version__}
    for name in ("gymnasium", "envpool", "matplotlib"):
        try:
            versions[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001  (missing, or broken on import)
            versions[name] = None
    return {"cpu": model, "cores": os.cpu_count(), "usable_cpus": usable_cpus(),
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "platform": platform.platform(), "hostname": platform.node(),
            "versions": versions, "time": time.strftime("%Y-%m-%d %H:%M:%S %z")}


# ---- measuring ----------------------------------------------------------------------------
def steps_per_second(step: Callable[[], object], num_envs: int, seconds: float) -> float:
    """Env steps per second of step() (num_envs env steps a call) over about `seconds`."""
    return timed_steps(step, num_envs, seconds)[0]


def timed_steps(step: Callable[[], object], num_envs: int,
                seconds: float) -> tuple[float, float]:
    """Env steps per second of step() (num_envs env steps a call) over about
    `seconds`, and the CPU time this process spent per env step over the same
    calls (ns; every thread of the process)."""
    start = time.perf_counter()
    step()  # warm up (and let adaptive dispatch measure itself)
    # Read the clock every 8 calls, or every call when calls are slow (so
    # that e.g. AsyncVectorEnv at N=64 does not overrun the time much).
    batch = 8 if time.perf_counter() - start < 1e-3 else 1
    calls, cpu, start = 0, time.process_time_ns(), time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(batch):
            step()
        calls += batch
        now = time.perf_counter()
        if now >= deadline:
            cpu = time.process_time_ns() - cpu
            return calls * num_envs / (now - start), cpu / (calls * num_envs)


class SyncRun:
    """Measures env.step(actions) of a (vector) env it owns: a gymnasium
    VectorEnv (batched action space), or EnvPool's (envpool=True: its
    action_space is one env's, and it is seeded at make)."""

    def __init__(self, env: Any, num_envs: int, envpool: bool = False):
        self.env, self.num_envs = env, num_envs
        if envpool:
            self.actions = _batch_of_actions(env.action_space, num_envs)
            env.reset()
        else:
            self.actions = np.asarray(env.action_space.sample())
            env.reset(seed=0)

    def rate(self, seconds: float) -> float:
        actions = self.actions
        step = self.env.step
        return steps_per_second(lambda: step(actions), self.num_envs, seconds)

    def call_times(self, count: int) -> np.ndarray:
        """Seconds of each of `count` step calls."""
        samples = np.empty(count)
        step, actions, clock = self.env.step, self.actions, time.perf_counter
        for i in range(count):
            start = clock()
            step(actions)
            samples[i] = clock() - start
        return samples

    def close(self) -> None:
        self.env.close()


def latency_rounds(runs: Mapping[str, SyncRun], rounds: int, per_round: int,
                   progress: Progress) -> dict[str, dict[str, Any]]:
    """Each run's round trip of one call (us) over interleaved rounds of
    per_round calls (gc paused): {name: {p50, p99, count, p50_rounds,
    p99_rounds}}, the percentiles over every call and per round."""
    samples: dict[str, list[np.ndarray]] = {name: [] for name in runs}

    def measure(name: str, round_index: int) -> float:
        progress.show(f"latency N=1 {name} (round {round_index + 1}/{rounds})")
        runs[name].call_times(10)  # warm up
        gc.disable()
        try:
            samples[name].append(runs[name].call_times(per_round) * 1e6)
        finally:
            gc.enable()
            progress.advance()
        return float(np.percentile(samples[name][-1], 50))

    p50_rounds = interleaved_rounds(list(runs), rounds, measure)
    results = {}
    for name, parts in samples.items():
        times = np.concatenate(parts)
        results[name] = {"p50": float(np.percentile(times, 50)),
                         "p99": float(np.percentile(times, 99)), "count": int(times.size),
                         "p50_rounds": p50_rounds[name],
                         "p99_rounds": [float(np.percentile(p, 99)) for p in parts]}
    return results


class EnvPoolAsyncRun:
    """EnvPool's async loop (batch_size N/2): recv a batch, send it straight back."""

    def __init__(self, env: Any, num_envs: int):
        self.env, self.batch = env, num_envs // 2
        self.actions = _batch_of_actions(env.action_space, self.batch)

    def rate(self, seconds: float) -> float:
        env, actions = self.env, self.actions
        env.async_reset()
        steps, start = 0, time.perf_counter()
        deadline = start + seconds
        while True:
            for _ in range(8):
                env.send(actions, env.recv()[4]["env_id"])
            steps += 8 * self.batch
            now = time.perf_counter()
            if now >= deadline:
                break
        # Receive what is in flight (N = 2 B: two batches); EnvPool's
        # async_reset crashes with sends pending, and no stepping may go on
        # in the background of the next measurement.
        env.recv()
        env.recv()
        return steps / (now - start)

    def close(self) -> None:
        self.env.close()


def _batch_of_actions(space: Any, n: int) -> np.ndarray:
    """n random actions of one env's space (Discrete or Box)."""
    rng = np.random.default_rng(0)
    if hasattr(space, "n"):
        return (space.start + rng.integers(0, space.n, n)).astype(space.dtype)
    return rng.uniform(space.low, space.high, (n, *space.shape)).astype(space.dtype)


def _envpool_make(env_id: str, n: int, batch_size: int, threads: str) -> Any:
    try:
        import envpool
    except Exception as exc:  # noqa: BLE001  (ImportError, or a broken build)
        raise Unavailable(f"envpool not installed (pip install 'envd-rl[bench]'): {exc}") from None
    count = 1 if threads == "1" else min(usable_cpus(), batch_size)
    return envpool.make(env_id, env_type="gymnasium", num_envs=n, batch_size=batch_size,
                        num_threads=count)


def _supports_fast_path(client: Any) -> bool:
    try:
        return "fast_path" in inspect.signature(type(client).make).parameters
    except (TypeError, ValueError):
        return False


def remote_env(client: Any, env_id: str, n: int, fast_path: bool) -> Any:
    """client.make through the socket path (fast_path False) or the fast path
    (True); Unavailable when the fast path is asked for and not served."""
    if not _supports_fast_path(client):
        if fast_path:
            raise Unavailable("fast path not available: Client.make has no fast_path option")
        return client.make(env_id, n, seed=0)
    try:
        env = client.make(env_id, n, seed=0, fast_path=fast_path)
    except (TypeError, envd.EnvdError) as exc:
        if fast_path:
            raise Unavailable(f"fast path not available: {exc}") from None
        raise
    taken = getattr(env, "fast_path", None)
    if taken is None or bool(taken) != fast_path:
        env.close()
        what = "has no fast_path attribute" if taken is None else f"has fast_path={taken}"
        if fast_path:
            raise Unavailable(f"fast path not available: the env {what}")
        raise RuntimeError(f"client.make(fast_path=False) returned an env that {what}")
    return env


def _gym_async(env_id: str, n: int) -> Any:
    import functools

    import gymnasium as gym
    # forkserver: the children fork from a clean server that imported
    # gymnasium once (fast to start, unlike spawn; safe, unlike forking this
    # process with its zmq and pool threads).
    return gym.vector.AsyncVectorEnv([functools.partial(gym.make, env_id)] * n,
                                     context="forkserver")


class Bench:
    """One run of the suite; holds what it started and releases it in close()."""

    def __init__(self, settings: Settings, out: TextIO | None = None):
        self.settings = settings
        self.out = sys.stdout if out is None else out
        self.cpus = usable_cpus()
        self.auto_threads = settings.threads if settings.threads is not None else self.cpus
        #: the threads of each of the two daemons compared with the auto one (bench_multi.py)
        self.half_threads = max(1, self.auto_threads // 2)
        self.inprocess_auto = envd.native.vector_env.default_num_threads()
        self.fixed_threads = _sweep_threads(self.cpus)
        self.daemons: dict[str, tuple[subprocess.Popen, str]] = {}
        self.clients: dict[str, Any] = {}
        #: the run's folder (its daemons' sockets) and daemons, registered with
        #: bench_teardown until close()
        self.folder: str | None = None
        self._registered = contextlib.ExitStack()
        self.progress = Progress(0, enabled=False)
        self.results: dict[str, Any] = {}

    # -- lifecycle
    def start_daemons(self) -> None:
        self.folder = self._registered.enter_context(
            bench_teardown.temporary_folder("envd-bench-suite-"))
        procs = {}
        for label, count in (("1", 1), ("auto", self.auto_threads),
                             ("half-a", self.half_threads), ("half-b", self.half_threads)):
            endpoint = f"ipc://{self.folder}/envd-{label}.sock"
            args = [sys.executable, "-m", "envd", "--bind", endpoint,
                    "--log-level", "warning", "--threads", str(count)]
            # The daemons are the benchmark's own: no ENVD_* setting of the
            # caller's (a metrics port, pinned CPUs, a bind address) applies.
            environ = {k: v for k, v in os.environ.items() if not k.startswith("ENVD_")}
            # preexec_fn: this runs before any client (and its threads) exists.
            procs[label] = (subprocess.Popen(
                args, cwd=self.folder, stdin=subprocess.DEVNULL, env=environ,
                preexec_fn=_die_with_parent), endpoint)
            self.daemons[label] = procs[label]
            self._registered.enter_context(bench_teardown.daemon(procs[label][0]))
        deadline = time.monotonic() + 90
        for label, (proc, endpoint) in procs.items():
            while label not in self.clients:
                try:
                    self.clients[label] = envd.connect(endpoint, timeout=5)
                except envd.EnvdError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"the daemon at {endpoint} did not start "
                                           f"(exit status {proc.poll()})") from None
                    time.sleep(0.05)

    def close(self) -> None:
        for client in self.clients.values():
            try:
                client.close()
            except Exception:  # noqa: BLE001  (closing what a failed run left: best effort)
                pass
        self.clients.clear()
        for proc, _ in self.daemons.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _ in self.daemons.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.daemons.clear()
        self._registered.close()  # (removes the folder)
        self.folder = None
        self.progress.close()

    # -- what is measured
    def configs(self, env_id: str, n: int) -> dict[tuple[str, str], Callable[[], Any]]:
        """(system, threads) -> a factory of the run object, for one env and N."""
        def in_process(count: int | None) -> Callable[[], Any]:
            return lambda: SyncRun(envd.make(env_id, n, seed=0, num_threads=count), n)

        def daemon(threads: str, fast_path: bool) -> Callable[[], Any]:
            return lambda: SyncRun(remote_env(self.clients[threads], env_id, n, fast_path), n)

        def envpool_sync(threads: str) -> Callable[[], Any]:
            return lambda: SyncRun(_envpool_make(env_id, n, n, threads), n, envpool=True)

        found: dict[tuple[str, str], Callable[[], Any]] = {}
        for threads in [*map(str, self.fixed_threads), "auto"]:
            found[("envd in-process", threads)] = in_process(
                None if threads == "auto" else int(threads))
        if env_id != ENV_ID:
            return found  # the other envs: the thread sweep only
        for threads in ("1", "auto"):
            found[("envd daemon socket", threads)] = daemon(threads, False)
            found[("envd fast path", threads)] = daemon(threads, True)
            found[("EnvPool sync", threads)] = envpool_sync(threads)
            found[("EnvPool async", threads)] = functools.partial(_envpool_async, env_id, n,
                                                                  threads)
        found[("gymnasium numpy vector", "-")] = lambda: _gym_vector(env_id, n)
        found[("gymnasium AsyncVectorEnv", "-")] = lambda: _gym_async_run(env_id, n)
        return found

    def measure_group(self, env_id: str, n: int) -> dict[tuple[str, str], list[float] | str]:
        """Every configuration of one env and N: env steps/s of each round
        (rounds interleaved), or the reason it was not measured ('n/a: ...' or
        '-: ...')."""
        s = self.settings
        factories = self.configs(env_id, n)
        runs: dict[tuple[str, str], Any] = {}
        results: dict[tuple[str, str], list[float] | str] = {}
        try:
            for key, factory in factories.items():
                self.progress.show(f"{env_id} N={n} starting {_label(key)}")
                try:
                    runs[key] = factory()
                except Unavailable as exc:
                    results[key] = f"n/a: {exc}"
                except NotApplicable as exc:
                    results[key] = f"-: {exc}"
                except Exception as exc:
                    if key[0] in ("envd in-process", "envd daemon socket"):
                        raise  # envd itself failing is not a benchmark result
                    # a peer, or the fast path, that cannot run here: say why, go on
                    results[key] = f"n/a: {type(exc).__name__}: {exc}"
            self.progress.advance(s.rounds * (len(factories) - len(runs)))

            def measure(key: tuple[str, str], round_index: int) -> float:
                self.progress.show(f"{env_id} N={n} {_label(key)} "
                                   f"(round {round_index + 1}/{s.rounds})")
                gc.disable()
                try:
                    return runs[key].rate(s.seconds)
                finally:
                    gc.enable()
                    self.progress.advance()

            results.update(interleaved_rounds(list(runs), s.rounds, measure))
        finally:
            for run in runs.values():
                run.close()
        return results

    def measure_latency(self) -> dict[str, dict[str, float] | str]:
        """Round trip of one step at N=1 (us, p50/p99): through the auto
        daemon's socket path and fast path, and per call in-process."""
        s = self.settings
        client = self.clients["auto"]
        factories = {
            "envd daemon socket": lambda: SyncRun(remote_env(client, ENV_ID, 1, False), 1),
            "envd fast path": lambda: SyncRun(remote_env(client, ENV_ID, 1, True), 1),
            "envd in-process": lambda: SyncRun(envd.make(ENV_ID, 1, seed=0), 1),
            "EnvPool sync": lambda: SyncRun(_envpool_make(ENV_ID, 1, 1, "1"), 1, envpool=True),
        }
        runs: dict[str, SyncRun] = {}
        results: dict[str, dict[str, Any] | str] = {}
        per_round = max(10, s.latency_steps // s.rounds)
        try:
            for name, factory in factories.items():
                try:
                    runs[name] = factory()
                except Unavailable as exc:
                    results[name] = f"n/a: {exc}"
            self.progress.advance(s.rounds * (len(factories) - len(runs)))
            results.update(latency_rounds(runs, s.rounds, per_round, self.progress))
        finally:
            for run in runs.values():
                run.close()
        return results

    def measure_scaling(self) -> dict[str, Any]:
        """4 client processes of 1024 envs stepping at once through the auto
        daemon, against one client process of 4096: aggregate env steps/s."""
        s = self.settings
        endpoint = self.daemons["auto"][1]
        context = multiprocessing.get_context("forkserver")
        groups = {"1x4096": [SCALING_CLIENTS * SCALING_ENVS], f"{SCALING_CLIENTS}x{SCALING_ENVS}":
                  [SCALING_ENVS] * SCALING_CLIENTS}
        workers: dict[str, list[tuple[Any, Any]]] = {name: [] for name in groups}
        self.progress.show("scaling: starting client processes")
        try:
            for name, sizes in groups.items():
                for n in sizes:
                    parent, child = context.Pipe()
                    proc = context.Process(target=scaling_client, args=(endpoint, ENV_ID, n, child),
                                           daemon=True)
                    proc.start()
                    child.close()
                    workers[name].append((proc, parent))
            fast_path = {}
            for name, members in workers.items():
                for _proc, conn in members:
                    if not conn.poll(120):
                        raise RuntimeError("a scaling client process did not start")
                    kind, value = conn.recv()
                    if kind == "error":
                        raise RuntimeError(f"a scaling client process failed: {value}")
                    fast_path[name] = value

            def measure(name: str, round_index: int) -> float:
                self.progress.show(f"scaling {name} (round {round_index + 1}/{s.rounds})")
                start = time.monotonic() + 0.05  # CLOCK_MONOTONIC: one clock for all processes
                for _, conn in workers[name]:
                    conn.send((start, start + s.scaling_seconds))
                replies = [conn.recv() for _, conn in workers[name]]
                steps = sum(r[0] for r in replies)
                end = max(r[1] for r in replies)
                self.progress.advance()
                return steps / (end - start)

            rounds = interleaved_rounds(list(groups), s.rounds, measure)
        finally:
            for members in workers.values():
                for _proc, conn in members:
                    try:
                        conn.send(None)
                    except (OSError, ValueError):
                        pass
            for members in workers.values():
                for proc, conn in members:
                    proc.join(30)
                    if proc.is_alive():
                        proc.kill()
                        proc.join()
                    conn.close()
        return {"steps_per_second": {name: spread(v).median for name, v in rounds.items()},
                "rounds": rounds, "fast_path": fast_path}

    def measure_pair(self) -> dict[str, Any]:
        """A cheap session capped at 0 threads next to a CPU-heavy one, against
        both uncapped (bench_pair.py), through the auto daemon."""
        s = self.settings
        self.progress.show("capped pair: starting client processes")
        return bench_pair.run(self.daemons["auto"][1], s.rounds, s.scaling_seconds,
                              on_measure=self._pair_progress)

    def _pair_progress(self, label: str) -> None:
        self.progress.show(f"capped pair {label}")
        self.progress.advance()

    def measure_learner(self) -> dict[str, Any]:
        """The async-with-learner comparison (bench_learner.py) through the
        auto daemon and in-process."""
        s = self.settings
        results = {}
        for env_id in bench_learner.LEARNER_ENVS:
            self.progress.show(f"learner {env_id}: starting")
            results[env_id] = bench_learner.measure_env(
                env_id, s.learner_envs, self.clients["auto"], s.rounds, s.learner_seconds,
                on_measure=self._learner_progress)
        return results

    def measure_multi(self) -> dict[str, Any]:
        """Async mode over the two half daemons against the auto daemon (bench_multi.py)."""
        s = self.settings
        self.progress.show("async over two daemons: starting")
        two = envd.connect([self.daemons["half-a"][1], self.daemons["half-b"][1]], timeout=30)
        try:
            return bench_multi.measure(self.clients["auto"], two, s.learner_envs, s.rounds,
                                       s.learner_seconds, on_measure=self._learner_progress)
        finally:
            two.close()

    def _learner_progress(self, label: str) -> None:
        self.progress.show(f"learner {label}")
        self.progress.advance()

    # -- the whole run
    def run(self) -> dict[str, Any]:
        s = self.settings
        machine = machine_info()
        print(_machine_text(machine, self), file=self.out, flush=True)
        multiprocessing.get_context("forkserver").set_forkserver_preload(["envd", "gymnasium"])
        groups = [(ENV_ID, n) for n in s.sizes] + [(e, n) for e in SWEEP_ENVS if e != ENV_ID
                                                   for n in s.sizes]
        total = sum(len(self.configs(env_id, n)) for env_id, n in groups) * s.rounds
        total += 4 * s.rounds + 2 * s.rounds  # latency rows, scaling groups
        total += len(bench_pair.CONFIGS) * s.rounds
        total += len(bench_learner.LEARNER_ENVS) * len(bench_learner.SYSTEMS) * 4 * s.rounds
        total += len(bench_multi.MULTI_ENVS) * len(bench_multi.SYSTEMS) * s.rounds
        self.progress = Progress(total, enabled=s.progress)
        before = bench_load.sample()
        self.progress.show("starting the daemons")
        self.start_daemons()
        groups_done: dict[str, dict[int, dict[tuple[str, str], list[float] | str]]] = {}
        for env_id, n in groups:
            groups_done.setdefault(env_id, {})[n] = self.measure_group(env_id, n)
        latency = self.measure_latency()
        scaling = self.measure_scaling()
        pair = self.measure_pair()
        learner = self.measure_learner()
        multi = self.measure_multi()
        self.close()  # the daemons exit and are reaped: their CPU time is ours
        after = bench_load.sample()
        machine["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
        machine["load"] = (bench_load.assess(before, after, self.cpus).as_dict()
                           if before and after else None)
        self.results = assemble(machine, self, groups_done, latency, scaling, learner, multi,
                                pair)
        return self.results


def _prctl() -> Callable[..., int] | None:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        return None


_PRCTL = _prctl()


def _die_with_parent() -> None:
    """In the daemon's child before exec: SIGTERM it when this process dies
    (Linux's PR_SET_PDEATHSIG), so that a crashed run leaves no daemon behind.
    Only a call into libc looked up beforehand: no import, no allocation."""
    if _PRCTL is not None:
        _PRCTL(1, int(signal.SIGTERM))  # 1: PR_SET_PDEATHSIG


def _envpool_async(env_id: str, n: int, threads: str) -> EnvPoolAsyncRun:
    if n < 2:
        raise NotApplicable("async batch_size N/2 needs N >= 2")
    return EnvPoolAsyncRun(_envpool_make(env_id, n, n // 2, threads), n)


def _gym_vector(env_id: str, n: int) -> SyncRun:
    import gymnasium as gym
    try:
        env = gym.make_vec(env_id, num_envs=n, vectorization_mode="vector_entry_point")
    except Exception as exc:  # noqa: BLE001  (an env without a numpy vector version)
        raise Unavailable(f"gymnasium has no vector_entry_point for {env_id}: {exc}") from None
    return SyncRun(env, n)


def _gym_async_run(env_id: str, n: int) -> SyncRun:
    if n > ASYNC_VECTOR_MAX:
        raise NotApplicable(f"one process per env: N <= {ASYNC_VECTOR_MAX} only")
    return SyncRun(_gym_async(env_id, n), n)


def _sweep_threads(cpus: int) -> list[int]:
    """Fixed thread counts of the sweep: 0..CPUs (on big machines 0, 1, 2, 3,
    then powers of two, CPUs - 1 and CPUs)."""
    if cpus <= 8:
        return list(range(cpus + 1))
    counts = {0, 1, 2, 3, cpus - 1, cpus}
    counts.update(1 << k for k in range(2, cpus.bit_length()))
    return sorted(c for c in counts if c <= cpus)


def _label(key: tuple[str, str]) -> str:
    return key[0] if key[1] == "-" else f"{key[0]} T={key[1]}"


def scaling_client(endpoint: str, env_id: str, n: int, conn: Any) -> None:
    """A client process of the scaling check: make n envs, report ("ready",
    whether the fast path was taken) or ("error", why), then for each (start,
    end) from the parent step from start (a time.monotonic value) until end
    and reply (steps, end time); None from the parent ends it."""
    try:
        client = envd.connect(endpoint, timeout=30)
        env = client.make(env_id, n, seed=0)
        env.reset(seed=0)
        actions = np.asarray(env.action_space.sample())
    except Exception as exc:  # noqa: BLE001  (reported to the parent, which raises)
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", bool(getattr(env, "fast_path", False))))
    try:
        while (window := conn.recv()) is not None:
            start, end = window
            env.step(actions)
            time.sleep(max(0.0, start - time.monotonic() - 0.002))
            while time.monotonic() < start:  # the last 2 ms spinning: start on time
                pass
            steps, now = 0, time.monotonic()
            gc.disable()
            while now < end:
                env.step(actions)
                steps += n
                now = time.monotonic()
            gc.enable()
            conn.send((steps, now))
    except EOFError:
        pass
    finally:
        env.close()
        client.close()


# ---- results ------------------------------------------------------------------------------
def _median_or_reason(cell: list[float] | str) -> float | str:
    return cell if isinstance(cell, str) else spread(cell).median


def assemble(machine: dict[str, Any], bench: Bench, groups: dict, latency: dict,
             scaling: dict, learner: dict | None = None,
             multi: dict | None = None, pair: dict | None = None) -> dict[str, Any]:
    """The results: each cell the median of its rounds (or why it is not
    measured), with every round's value next to it."""
    s = bench.settings
    main = groups[ENV_ID]
    rows = []
    for system, threads in ROWS:
        measured = {n: main[n].get((system, threads), "-: not measured") for n in s.sizes}
        rows.append({"system": system, "threads": threads,
                     "cells": {n: _median_or_reason(c) for n, c in measured.items()},
                     "rounds": {n: c for n, c in measured.items() if isinstance(c, list)}})
    sweep: dict[str, Any] = {}
    sweep_rounds: dict[str, Any] = {}
    for env_id in SWEEP_ENVS:
        keys = [*map(str, bench.fixed_threads), "auto"]
        by_threads = {t: {n: groups[env_id][n][("envd in-process", t)] for n in s.sizes}
                      for t in keys}
        sweep[env_id] = {t: {n: _median_or_reason(c) for n, c in cells.items()}
                         for t, cells in by_threads.items()}
        sweep_rounds[env_id] = {t: {n: c for n, c in cells.items() if isinstance(c, list)}
                                for t, cells in by_threads.items()}
    results = {
        "machine": machine,
        "settings": dataclasses.asdict(s),
        "threads": {"auto_daemon": bench.auto_threads, "auto_in_process": bench.inprocess_auto,
                    "auto_envpool": f"min({bench.cpus}, batch_size)",
                    "half_daemons": bench.half_threads,
                    "sweep_fixed": bench.fixed_threads},
        "env_id": ENV_ID,
        "sizes": list(s.sizes),
        "table": rows,
        "latency_us": latency,
        "thread_sweep": sweep,
        "thread_sweep_rounds": sweep_rounds,
        "scaling": scaling,
        "learner": bench_learner.summary(learner) if learner else {},
        "multi_async": bench_multi.summary(multi) if multi else {},
        "capped_pair": bench_pair.summary(pair) if pair else {},
    }
    results["targets"] = targets(results)
    return results


def targets(r: dict[str, Any]) -> list[dict[str, Any]]:
    """The performance targets, each judged over the rounds
    (bench_rounds.judge: PASS, FAIL, NOT JUDGED when the spread is wider than
    the margin, N/A when not measured), with its numbers: {target, status,
    value (median), spread (half the min-max range), margin, op, limit, detail}.
    A ratio of two configurations is taken round by round."""
    found = []

    def add(name: str, values: list[float] | None, op: str, limit: float, detail: str) -> None:
        found.append({"target": name, **judge(values, op, limit), "op": op, "limit": limit,
                      "detail": detail})

    def rounds(system: str, threads: str, n: int) -> list[float] | None:
        for row in r["table"]:
            if row["system"] == system and row["threads"] == threads:
                return row.get("rounds", {}).get(n) or None
        return None

    def why(value: Any, default: str = "not measured") -> str:
        return value[5:] if isinstance(value, str) and value.startswith("n/a: ") else default

    lat = r["latency_us"]
    fast_path, pool = lat.get("envd fast path"), lat.get("EnvPool sync")
    fast_path_p50 = fast_path["p50_rounds"] if isinstance(fast_path, dict) else None
    pool_p50 = pool["p50_rounds"] if isinstance(pool, dict) else None
    add("N=1 fast path round trip p50 <= 15 us", fast_path_p50, "<=", 15.0,
        f"p50 {spread_text(fast_path_p50, _us)}" if fast_path_p50 else why(fast_path))
    ratio = paired_ratios(fast_path_p50, pool_p50) if fast_path_p50 and pool_p50 else None
    add("N=1 fast path round trip p50 <= 0.5x EnvPool in-process per call", ratio, "<=", 0.5,
        f"{spread_text(fast_path_p50, _us)} / {spread_text(pool_p50, _us)} = {ratio_text(ratio)}"
        if ratio and fast_path_p50 and pool_p50 else why(fast_path, "") or why(pool))

    def daemon_best(n: int) -> tuple[list[float] | None, str]:
        """The daemon path with the higher median at n, and its rounds."""
        options = [(spread(v).median, name, v) for name in ("envd daemon socket", "envd fast path")
                   if (v := rounds(name, "auto", n))]
        if not options:
            return None, ""
        _, which, values = max(options)
        return values, which

    sizes = r["sizes"]
    name = "N=4096 daemon (best of socket/fast path, T=auto) >= 0.9x envd in-process (T=auto)"
    best, which = daemon_best(4096)
    inproc = rounds("envd in-process", "auto", 4096)
    ratio = paired_ratios(best, inproc) if best and inproc else None
    if ratio and best and inproc:
        detail = f"{which} {spread_text(best)} / {spread_text(inproc)} = {ratio_text(ratio)}"
    else:
        detail = "N=4096 not in --sizes" if 4096 not in sizes else "not measured"
    add(name, ratio, ">=", 0.9, detail)
    name = "N=1024 daemon (best of socket/fast path, T=auto) >= 5x EnvPool sync (best T)"
    best, which = daemon_best(1024)
    pools = [v for v in (rounds("EnvPool sync", t, 1024) for t in ("1", "auto")) if v]
    pool_best = max(pools, key=lambda v: spread(v).median) if pools else None
    ratio = paired_ratios(best, pool_best) if best and pool_best else None
    if ratio and best and pool_best:
        detail = f"{which} {spread_text(best)} / {spread_text(pool_best)} = {ratio_text(ratio)}"
    elif 1024 not in sizes:
        detail = "N=1024 not in --sizes"
    else:
        detail = why(next((row["cells"][1024] for row in r["table"]
                           if row["system"] == "EnvPool sync"), None))
    add(name, ratio, ">=", 5.0, detail)
    for env_id, by_threads in r["thread_sweep_rounds"].items():
        for n in sizes:
            fixed = {t: cells.get(n) for t, cells in by_threads.items() if t != "auto"}
            fixed = {t: v for t, v in fixed.items() if v}
            auto = by_threads.get("auto", {}).get(n)
            name = f"{env_id} N={n}: auto threads >= 0.95x the best fixed count (in-process)"
            if not fixed or not auto:
                add(name, None, ">=", 0.95, "not measured")
                continue
            t_best = max(fixed, key=lambda t: spread(fixed[t]).median)
            ratio = paired_ratios(auto, fixed[t_best])
            add(name, ratio, ">=", 0.95, f"auto {spread_text(auto)} / threads={t_best} "
                f"{spread_text(fixed[t_best])} = {ratio_text(ratio)}")
    by_group = r["scaling"].get("rounds", {})
    many, one = f"{SCALING_CLIENTS}x{SCALING_ENVS}", f"1x{SCALING_CLIENTS * SCALING_ENVS}"
    ratio = paired_ratios(by_group[many], by_group[one]) \
        if by_group.get(many) and by_group.get(one) else None
    add(f"{SCALING_CLIENTS} clients x {SCALING_ENVS} envs at once (aggregate) >= 0.8x one "
        f"client x {SCALING_CLIENTS * SCALING_ENVS}", ratio, ">=", 0.8,
        f"{spread_text(by_group[many])} / {spread_text(by_group[one])} = {ratio_text(ratio)}"
        if ratio else "not measured")
    found.extend(bench_pair.targets(r.get("capped_pair", {})))
    found.extend(bench_learner.targets(r.get("learner", {})))
    found.extend(bench_multi.targets(r.get("multi_async", {})))
    return found


def _us(x: float) -> str:
    return f"{x:.1f} us"


def _machine_text(m: dict[str, Any], bench: Bench) -> str:
    v = m["versions"]
    peers = ", ".join(f"{k} {v[k] or 'not installed'}"
                      for k in ("gymnasium", "envpool", "matplotlib"))
    load = " ".join(f"{x:.2f}" for x in m["load_average"])
    return (f"envd bench  {m['time']}  host {m['hostname']}\n"
            f"CPU: {m['cpu']}, {m['cores']} cores ({m['usable_cpus']} usable), "
            f"load average {load}\n"
            f"envd {v['envd']}, Python {v['python']}, numpy {v['numpy']}, {peers}\n"
            f"threads: auto = daemon --threads {bench.auto_threads}; in-process num_threads=None "
            f"({bench.inprocess_auto} worker(s) + the caller); EnvPool num_threads=min("
            f"{bench.cpus}, batch_size)\n"
            f"each configuration: {bench.settings.rounds} rounds of {bench.settings.seconds:g} s, "
            f"interleaved (every configuration compared once per round, shuffled), gc paused;\n"
            f"figures are medians over rounds, '±' half the min-max range over rounds "
            f"(relative to the median for rates)")


def _cell_text(cell: Any, values: list[float] | None = None) -> str:
    """A table cell: '24.1M ±3%' from its rounds, the bare median without
    them, else 'n/a' or '-'."""
    if values:
        return spread_text(values)
    if isinstance(cell, float):
        return rate_text(cell)
    return "n/a" if str(cell).startswith("n/a") else "-"


CELL = 13  # width of a table column: '24.1M ±120%' fits


def load_text(machine: dict[str, Any]) -> str:
    """The load line: the warning, or the figures of a quiet machine."""
    load = machine.get("load")
    if not load:
        return "machine load: not measured (no Linux /proc)"
    if load["reasons"]:
        return bench_load.warning_text(load["reasons"])
    return (f"machine load: quiet (other processes {100 * load['other_fraction']:.0f}%, "
            f"steal {100 * load['steal_fraction']:.0f}% of {load['cpus']} usable CPU(s); "
            f"load average {load['load_before']:.2f} before, {load['load_after']:.2f} after)")


def report(r: dict[str, Any]) -> str:
    """The printed report: table, latency, thread sweep, scaling, ratios, targets."""
    sizes = r["sizes"]
    t = r["threads"]
    lines = [f"\n{load_text(r['machine'])}" if "machine" in r else "",
             f"\n{r['env_id']}: env steps per second (median of rounds, ± half their range)",
             f"{'system':<26}{'threads':>8}" + "".join(f"{'N=' + str(n):>{CELL}}" for n in sizes)]
    notes: dict[tuple[str, str], list[int]] = {}
    for row in r["table"]:
        threads = row["threads"]
        if threads == "auto":
            threads = {"envd in-process": f"auto({t['auto_in_process']})",
                       "envd daemon socket": f"auto({t['auto_daemon']})",
                       "envd fast path": f"auto({t['auto_daemon']})"}.get(row["system"], "auto")
        head = f"{row['system']:<26}{threads:>8}"
        cells = list(row["cells"].values())
        reasons = {c for c in cells if isinstance(c, str) and c.startswith("n/a")}
        if reasons and all(isinstance(c, str) and c.startswith("n/a") for c in cells) \
                and len(reasons) == 1:
            lines.append(f"{head}  n/a ({reasons.pop()[5:]})")
            continue
        by_round = row.get("rounds", {})
        lines.append(head + "".join(f"{_cell_text(c, by_round.get(n)):>{CELL}}"
                                    for n, c in row["cells"].items()))
        for n, c in row["cells"].items():
            if isinstance(c, str):
                ns = notes.setdefault((row["system"], c), [])
                ns.extend([n] if n not in ns else [])
    for (system, note), ns in notes.items():
        mark, reason = note.split(": ", 1) if ": " in note else ("-", note)
        lines.append(f"  {mark:<3} {system} at N={','.join(map(str, ns))}: {reason}")
    lines.append("\nround trip of one step at N=1 (us)")
    for name, value in r["latency_us"].items():
        if isinstance(value, dict):
            p50 = spread(value["p50_rounds"]) if value.get("p50_rounds") else None
            each = (f"   (per round: p50 {p50.low:.1f}-{p50.high:.1f})" if p50 else "")
            lines.append(f"  {name:<22} p50 {value['p50']:8.1f}   p99 {value['p99']:8.1f}{each}")
        else:
            lines.append(f"  {name:<22} n/a ({value[5:]})")
    lines.append("\nthread sweep, envd in-process: env steps per second")
    for env_id, by_threads in r["thread_sweep"].items():
        lines.append(f"{env_id:<14}{'threads':>8}"
                     + "".join(f"{'N=' + str(n):>{CELL}}" for n in sizes))
        by_round = r.get("thread_sweep_rounds", {}).get(env_id, {})
        for threads, row in by_threads.items():
            label = f"auto({t['auto_in_process']})" if threads == "auto" else threads
            lines.append(f"{'':<14}{label:>8}" + "".join(
                f"{_cell_text(row[n], by_round.get(threads, {}).get(n)):>{CELL}}"
                for n in sizes))
    sc = r["scaling"]
    lines.append("\nclients stepping at once through one daemon (T=auto): aggregate env steps/s")
    for name, rate in sc["steps_per_second"].items():
        path = "fast path" if sc["fast_path"].get(name) else "socket path"
        values = sc.get("rounds", {}).get(name)
        lines.append(f"  {name:<10} {_cell_text(rate, values):>{CELL}}  ({path})")
    if r.get("capped_pair"):
        lines.append("\na cheap session capped at max_threads=0 next to a CPU-heavy one, two "
                     "client processes at once\nthrough one daemon (T=auto): env steps/s")
        lines.extend(bench_pair.report_lines(r["capped_pair"]))
    lines.append("\nratios (T=auto; median of per-round ratios ± half their range)")
    rows = {(row["system"], row["threads"]): row.get("rounds", {}) for row in r["table"]}
    inproc = rows[("envd in-process", "auto")]
    for system in ("envd daemon socket", "envd fast path"):
        for base, base_rounds in (("envd in-process", inproc),
                                  ("EnvPool sync", rows[("EnvPool sync", "auto")])):
            ratios = [_ratio(rows[(system, "auto")].get(n), base_rounds.get(n)) for n in sizes]
            lines.append(f"  {system + ' / ' + base:<44}" + ratio_cells(ratios))
    if r.get("learner"):
        lines.append("\nasync with a learner: env steps per second, sync (step N, learn N) and "
                     "async (recv B, send B, learn B);\nthe learner takes T per env step learnt "
                     "on, T = one envd in-process sync step / N; sleep: time.sleep, busy: a CPU "
                     "loop")
        lines.extend(bench_learner.report_lines(r["learner"]))
    if r.get("multi_async"):
        lines.extend(bench_multi.report_lines(r["multi_async"], t["auto_daemon"],
                                              t.get("half_daemons", 1)))
    lines.append("\ntargets (PASS/FAIL; NOT JUDGED: the spread over rounds is wider than the "
                 "margin to the target)")
    for target in r["targets"]:
        lines.append(f"  {target['status']:<10}  {target['target']}: {target['detail']}")
    if "machine" in r and (r["machine"].get("load") or {}).get("reasons"):
        lines.append(f"\n{load_text(r['machine'])}")  # again, next to the verdicts
    return "\n".join(line for line in lines if line != "")


def ratio_cells(texts: Sequence[str]) -> str:
    """Ratio texts as right-aligned cells of CELL characters, each after a
    space: '47.34x ±20.19' fills a whole cell, and must not run into the
    cell before it."""
    return "".join(f" {text:>{CELL - 1}}" for text in texts)


def _ratio(a: list[float] | None, b: list[float] | None) -> str:
    """Per-round ratio text of two configurations' rounds, '-' without both."""
    ratios = paired_ratios(a, b) if a and b else None
    return ratio_text(ratios) if ratios else "-"


def write_csv(r: dict[str, Any], path: Path) -> None:
    """One line per measured configuration: the median and the min-max of its
    rounds, or why it was not measured (note)."""
    def spread_cells(values: list[float] | None) -> list[Any]:
        if not values:
            return ["", "", "", ""]
        s = spread(values)
        return [s.median, s.low, s.high, s.rounds]

    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["section", "env_id", "system", "threads", "num_envs",
                      "steps_per_second", "min", "max", "rounds", "note"])
        for row in r["table"]:
            for n, c in row["cells"].items():
                out.writerow(["table", r["env_id"], row["system"], row["threads"], n,
                              *spread_cells(row.get("rounds", {}).get(n)),
                              "" if isinstance(c, float) else c])
        for env_id, by_threads in r["thread_sweep"].items():
            by_round = r.get("thread_sweep_rounds", {}).get(env_id, {})
            for threads, cells in by_threads.items():
                for n, c in cells.items():
                    out.writerow(["thread_sweep", env_id, "envd in-process", threads, n,
                                  *spread_cells(by_round.get(threads, {}).get(n)),
                                  "" if isinstance(c, float) else c])
        for name in r["scaling"]["steps_per_second"]:
            clients, n = name.split("x")
            out.writerow(["scaling", r["env_id"], f"envd daemon, {clients} client(s)", "auto",
                          n, *spread_cells(r["scaling"].get("rounds", {}).get(name)),
                          "aggregate"])
        pair = r.get("capped_pair") or {}
        for config, sessions in pair.get("rounds", {}).items():
            for session, values in sessions.items():
                out.writerow(["capped_pair", pair[session]["env_id"], f"envd daemon, {session} "
                              f"session", config, pair[session]["num_envs"],
                              *spread_cells(values), "next to the other session"])
            out.writerow(["capped_pair", "-", "envd daemon, pair total", config, "-",
                          *spread_cells(pair["totals"].get(config)), "sum of both sessions"])
        for env_id, entry in r.get("learner", {}).items():
            for system, learners in entry["rounds"].items():
                for learner, modes in learners.items():
                    for mode, values in modes.items():
                        out.writerow(["learner", env_id, system, f"{mode}, {learner} learner",
                                      entry["num_envs"], *spread_cells(values),
                                      f"batch {entry['batch_size']}"])
            for system, why in entry["missing"].items():
                out.writerow(["learner", env_id, system, "", entry["num_envs"],
                              "", "", "", "", f"n/a: {why}"])
        threads = r.get("threads", {})
        for env_id, entry in r.get("multi_async", {}).items():
            for system, values in entry["rounds"].items():
                count = (f"2 x {threads.get('half_daemons', '?')}" if system == "two daemons"
                         else str(threads.get("auto_daemon", "auto")))
                out.writerow(["multi_async", env_id, system, count, entry["num_envs"],
                              *spread_cells(values),
                              f"batch {entry['batch_size']}, {entry['paths'].get(system, '')}"])


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def plot(r: dict[str, Any], path: Path) -> str | None:
    """Steps/s against N (log-log), one line per row; the reason when it cannot."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:  # noqa: BLE001
        return f"matplotlib not installed (pip install 'envd-rl[bench]'): {exc}"
    fig, ax = plt.subplots(figsize=(10, 6))
    systems = list(dict.fromkeys(row["system"] for row in r["table"]))
    colors = plt.get_cmap("tab10")
    for row in r["table"]:
        points = [(n, c) for n, c in row["cells"].items() if isinstance(c, float)]
        if not points:
            continue
        label = row["system"] if row["threads"] == "-" else f"{row['system']}, T={row['threads']}"
        # a colour per system; threads=1 dashed, auto (or none) solid
        ax.plot(*zip(*points), "--" if row["threads"] == "1" else "-",
                marker="o" if row["system"].startswith("envd") else "s",
                color=colors(systems.index(row["system"]) % 10), label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(r["sizes"], [str(n) for n in r["sizes"]])
    ax.minorticks_off()
    ax.set_xlabel("num_envs (N)")
    ax.set_ylabel("env steps per second")
    m = r["machine"]
    ax.set_title(f"{r['env_id']} on {m['cpu']} ({m['usable_cpus']} CPUs), {m['time'][:16]}",
                 fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


def write_outputs(r: dict[str, Any], text: str, out: Path) -> list[str]:
    """results.json, results.csv, report.txt, readme_table.md (the README's
    benchmark section) and steps_per_second.png; returns notes."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(_jsonable(r), indent=2) + "\n")
    write_csv(r, out / "results.csv")
    (out / "report.txt").write_text(text + "\n")
    (out / "readme_table.md").write_text(bench_readme.readme_text(r))
    problem = plot(r, out / "steps_per_second.png")
    return [f"no plot: {problem}"] if problem else []


def default_out() -> str:
    return f"envd-bench-{time.strftime('%Y%m%d-%H%M%S')}"


def main(settings: Settings, stdout: TextIO | None = None) -> int:
    """Run the suite, print the report, write the files; exit status 0 (the
    targets are reported, not enforced)."""
    stdout = sys.stdout if stdout is None else stdout
    bench = Bench(settings, stdout)
    try:
        with warnings.catch_warnings():
            # EnvPool's spaces make gymnasium warn about float64 bounds cast to float32.
            warnings.filterwarnings("ignore", message=".*precision lowered by casting")
            results = bench.run()
    finally:
        bench.close()
    text = report(results)
    print(text, file=stdout)
    out = Path(settings.out or default_out())
    for note in write_outputs(results, text, out):
        print(f"\n{note}", file=stdout)  # apart from the target lines above
    print(f"\nwrote {out}/results.json, results.csv, report.txt, readme_table.md"
          + ("" if not (out / "steps_per_second.png").exists() else ", steps_per_second.png"),
          file=stdout)
    return 0


def parse_sizes(values: Iterable[int]) -> tuple[int, ...]:
    sizes = tuple(sorted(set(values)))
    if not sizes or sizes[0] < 1:
        raise ValueError("--sizes must be positive env counts")
    return sizes


__all__ = ["Bench", "Progress", "Settings", "main", "report", "targets"]
