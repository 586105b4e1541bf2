"""CPU time per vector step of hosted envs, by process, against gymnasium's
SyncVectorEnv: a measure that a loaded machine distorts far less than
wall-clock rates (issue 37).

    python bench/hosted_cpu.py [--envs HalfCheetah-v5,Humanoid-v5,Acrobot-v1,noop]
                               [--num-envs 16] [--steps 500] [--rounds 3] [--no-daemon]

"noop" is an env whose step costs nothing (in-process only): what its
workers spend is envd's own cost per vector step, the wake-ups and the
slice's bookkeeping.  Run the script with two installs' interpreters in
turn to compare them (the CPU time, unlike the rates, stays comparable on a
loaded machine).

For each env, in interleaved rounds, every system steps the same pre-drawn
actions for --steps steps, and the CPU time each of its processes spent
is divided by the steps:

  - gymnasium SyncVectorEnv: the caller's CPU (time.process_time);
  - envd.make("py:<id>", N, num_workers=W), W = 1, 2: the caller's CPU (the
    "parent": its step call, the wait, the results) and each worker's
    (/proc/<pid>/schedstat, nanoseconds);
  - through a daemon (fast path, W = 1, 2): the caller's CPU, the daemon's
    (every thread of it: the serving thread) and its workers' (the
    daemon's descendants).

Ideal: the workers' CPU per step together equals SyncVectorEnv's (they run
the same env.step calls), the parent's and the daemon's near 0.  Printed
per system: median over rounds of wall us/step, parent, daemon and worker
CPU us/step, and the ratios (workers / sync, everything / sync).  A
measurement, not a test.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from hosted_python import NoopEnv  # (bench/, this script's folder, is on sys.path)

import envd
from envd.tools.bench_python import batch_of_actions, hosting_daemon, process_cpu_seconds


def children_of(pid: int) -> list[int]:
    """Every descendant of pid (from /proc's parent links)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def daemon_pid() -> int | None:
    """The daemon hosting_daemon started: this process's child running envd."""
    for child in children_of(os.getpid()):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            if b"--bind" in argv and b"envd" in argv:
                return child
    return None


class System:
    """One system: its env (step(actions)), its worker processes and the
    daemon process whose CPU counts (None: in-process)."""

    def __init__(self, env: Any, workers: list[int], daemon: int | None = None):
        self.env, self.workers, self.daemon = env, workers, daemon

    def measure(self, actions: np.ndarray, steps: int) -> dict[str, float]:
        env = self.env
        env.reset(seed=0)
        for i in range(10):
            env.step(actions[i % len(actions)])
        workers0 = [process_cpu_seconds(p) for p in self.workers]
        daemon0 = process_cpu_seconds(self.daemon) if self.daemon else 0.0
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for i in range(steps):
            env.step(actions[i % len(actions)])
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        daemon = (process_cpu_seconds(self.daemon) - daemon0) if self.daemon else 0.0
        workers = sum(process_cpu_seconds(p) - c for p, c in zip(self.workers, workers0))
        scale = 1e6 / steps
        return {"wall": wall * scale, "parent": cpu * scale, "daemon": daemon * scale,
                "workers": workers * scale}


def measure_env(env_id: str, n: int, steps: int, rounds: int, client: Any) -> None:
    noop = env_id == "noop"
    sync = (gym.vector.SyncVectorEnv([NoopEnv] * n) if noop
            else gym.make_vec(env_id, n, vectorization_mode="sync"))
    actions = np.stack([batch_of_actions(sync.single_action_space, n, seed) for seed in range(8)])
    systems = {"gymnasium sync": System(sync, [])}
    for workers in (1, 2):
        env = envd.make(NoopEnv if noop else "py:" + env_id, n, num_workers=workers)
        systems[f"envd {workers} worker(s)"] = System(env, env.worker_pids)
    daemon = daemon_pid() if client is not None and not noop else None
    if client is not None and daemon is not None:
        for workers in (1, 2):
            before = set(children_of(daemon))  # (this env's workers: those it adds)
            env = client.make("py:" + env_id, n, num_workers=workers, fast_path=True)
            added = [p for p in children_of(daemon) if p not in before]
            systems[f"daemon {workers} worker(s)"] = System(env, added, daemon)
    results: dict[str, list[dict[str, float]]] = {name: [] for name in systems}
    for _ in range(rounds):  # interleaved: a load change hits every system
        for name, system in systems.items():
            results[name].append(system.measure(actions, steps))
    base = np.median([r["parent"] for r in results["gymnasium sync"]])
    print(f"\n{env_id}, N={n}: us per vector step (median of {rounds} rounds of {steps} steps)")
    print(f"  {'system':22s} {'wall':>8s} {'parent':>8s} {'daemon':>8s} {'workers':>8s}"
          f"   workers/sync  all/sync")
    for name, rows in results.items():
        med = {key: float(np.median([r[key] for r in rows])) for key in rows[0]}
        total = med["parent"] + med["daemon"] + med["workers"]
        work = med["workers"] if med["workers"] else med["parent"]
        print(f"  {name:22s} {med['wall']:8.0f} {med['parent']:8.0f} {med['daemon']:8.0f} "
              f"{med['workers']:8.0f}   {work / base:12.2f}  {total / base:8.2f}")
    for system in systems.values():
        system.env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", default="HalfCheetah-v5,Humanoid-v5,Acrobot-v1")
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-daemon", action="store_true")
    args = parser.parse_args()
    env_ids = tuple(args.envs.split(","))
    with contextlib.ExitStack() as stack:
        hosted = tuple(env_id for env_id in env_ids if env_id != "noop")
        client = None if args.no_daemon or not hosted else stack.enter_context(
            hosting_daemon(hosted))
        for env_id in env_ids:
            measure_env(env_id, args.num_envs, args.steps, args.rounds, client)


if __name__ == "__main__":
    main()
