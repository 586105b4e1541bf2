"""Stepping through the daemon versus in-process, and versus EnvPool.

Starts its own daemon (default thread count, a temporary ipc endpoint), then
measures CartPole-v1 (or --env) env steps per second for N in {1, 64, 1024,
4096}, all in one run:

  - daemon:     envd.connect(...).make(env, N)   (shared memory, ipc socket)
  - in-process: envd.make(env, N)                (default threads)
  - EnvPool:    envpool.make(env, env_type="gymnasium", num_envs=N,
                batch_size=N, num_threads=<usable CPUs>) in sync mode, when
                the optional `bench` extra is installed (pip install '.[bench]')

and the round-trip latency of one step at N=1 through the daemon (p50/p99).
Ratios printed, with the targets of the daemon issue:

  - daemon / in-process at N=4096   >= 0.7x
  - daemon / EnvPool at N=1024      >= 5x

Machines are noisy: the systems of one N are measured round by round (each
once per round, in a shuffled order, the garbage collector paused); figures
are medians over rounds with half their min-max range (±), ratios are taken
round by round (envd.tools.bench_rounds, as `envd bench` does).

    python bench/bench_daemon.py [--env CartPole-v1] [--seconds 0.3] [--rounds 5] [--threads T]
"""
from __future__ import annotations

import argparse
import gc
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

import envd
from envd.tools.bench_rounds import interleaved_rounds, paired_ratios, ratio_text, spread_text

SIZES = [1, 64, 1024, 4096]


def steps_per_second(env, actions: np.ndarray, seconds: float) -> float:
    """Env steps per second of env.step(actions) over about `seconds`."""
    env.step(actions)
    calls, start = 0, time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(8):
            env.step(actions)
        calls += 8
        now = time.perf_counter()
        if now >= deadline:
            return calls * len(actions) / (now - start)


def start_daemon(folder: str, threads: int | None) -> tuple[subprocess.Popen, str]:
    endpoint = f"ipc://{folder}/envd.sock"
    args = [sys.executable, "-m", "envd", "--bind", endpoint, "--log-level", "warning"]
    if threads is not None:
        args += ["--threads", str(threads)]
    proc = subprocess.Popen(args, cwd=folder)
    deadline = time.monotonic() + 60
    while True:
        try:
            envd.connect(endpoint, timeout=2).close()
            return proc, endpoint
        except envd.EnvdError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("the daemon did not start") from None
            time.sleep(0.05)


def make_envpool(env_id: str, n: int):
    try:
        import envpool
    except ImportError:
        return None
    cpus = len(os.sched_getaffinity(0))
    return envpool.make(env_id, env_type="gymnasium", num_envs=n, batch_size=n,
                        num_threads=min(cpus, n))


def measure(client: envd.Client, env_id: str, seconds: float,
            rounds: int) -> dict[str, dict[int, list[float]]]:
    """{system: {N: env steps/s of each round}}."""
    table: dict[str, dict[int, list[float]]] = {}
    for n in SIZES:
        systems = {"daemon": client.make(env_id, n, seed=0), "in-process": envd.make(env_id, n, seed=0)}
        pool = make_envpool(env_id, n)
        if pool is not None:
            systems["EnvPool sync"] = pool
        sample = systems["in-process"].action_space.sample()
        # EnvPool wants its own action dtype (int32 for discrete actions).
        actions = {name: sample.astype(env.action_space.dtype) for name, env in systems.items()}
        for env in systems.values():
            env.reset()

        def one(name: str, round_index: int) -> float:
            gc.disable()
            try:
                return steps_per_second(systems[name], actions[name], seconds)
            finally:
                gc.enable()

        by_round = interleaved_rounds(list(systems), rounds, one)
        for name, env in systems.items():
            table.setdefault(name, {})[n] = by_round[name]
            env.close()
        print(f"  measured N={n}", flush=True)
    return table


def latency(client: envd.Client, env_id: str, count: int) -> tuple[float, float]:
    """p50 and p99 of one step's round trip through the daemon at N=1 (us)."""
    with client.make(env_id, 1, seed=0) as env:
        env.reset()
        actions = env.action_space.sample()
        samples = np.empty(count)
        gc.disable()
        try:
            for i in range(count):
                start = time.perf_counter()
                env.step(actions)
                samples[i] = time.perf_counter() - start
        finally:
            gc.enable()
    return float(np.percentile(samples, 50) * 1e6), float(np.percentile(samples, 99) * 1e6)


def report(env_id: str, table: dict[str, dict[int, list[float]]], p50: float, p99: float) -> None:
    print(f"\n{env_id}: env steps per second (median of rounds, ± half their range)")
    print(f"{'system':<14}" + "".join(f"{'N=' + str(n):>14}" for n in SIZES))
    for name, row in table.items():
        print(f"{name:<14}" + "".join(f"{spread_text(row[n]):>14}" for n in SIZES))
    print(f"\nround trip through the daemon at N=1: p50 {p50:.0f} us, p99 {p99:.0f} us")
    print("\nratios")
    for n in SIZES:
        ratio = ratio_text(paired_ratios(table["daemon"][n], table["in-process"][n]))
        target = "  (target >= 0.7x)" if n == 4096 else ""
        print(f"  daemon / in-process at N={n:<5}: {ratio:>12}{target}")
    if "EnvPool sync" in table:
        for n in SIZES:
            ratio = ratio_text(paired_ratios(table["daemon"][n], table["EnvPool sync"][n]))
            target = "  (target >= 5x)" if n == 1024 else ""
            print(f"  daemon / EnvPool sync at N={n:<5}: {ratio:>12}{target}")
    else:
        print("  EnvPool not installed (pip install '.[bench]'): no EnvPool column")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--seconds", type=float, default=0.3, help="per measurement")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="daemon threads (default: its own)")
    parser.add_argument("--latency-steps", type=int, default=5000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="envd-bench-") as folder:
        proc, endpoint = start_daemon(folder, args.threads)
        try:
            with envd.connect(endpoint) as client:
                status = client.status()
                print(f"envd {envd.__version__}: daemon with {status['threads']} thread(s); "
                      f"in-process with {envd.native.vector_env.default_num_threads()} worker(s) "
                      f"+ the caller; {len(os.sched_getaffinity(0))} usable CPUs")
                table = measure(client, args.env, args.seconds, args.rounds)
                p50, p99 = latency(client, args.env, args.latency_steps)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    report(args.env, table, p50, p99)


if __name__ == "__main__":
    main()
