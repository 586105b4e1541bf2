"""Agent-steps per second of the multi-agent built-in simple_spread_v3: envd
(in-process, serial and with threads) against mpe2 stepped the way a
SyncVectorEnv steps Python envs (a loop over N parallel envs, each reset when
its episode ends).

    python bench/bench_multi_agent.py --envs 1024 --rounds 5

The configurations are measured in interleaved rounds (every configuration
once per round, in a shuffled order), so load that comes and goes on a shared
machine hits them alike; the median round is printed with the load average.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import time
import warnings

import numpy as np

import envd

AGENTS = 3


def envd_round(env, actions: np.ndarray, seconds: float) -> float:
    """Agent-steps/s of env (already reset) stepped for about `seconds`."""
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.step(actions[steps % len(actions)])
        steps += 1
    return steps * env.num_envs / (time.perf_counter() - start)


def mpe2_round(envs, actions: np.ndarray, seconds: float) -> float:
    """Agent-steps/s of a Python loop over the mpe2 parallel envs."""
    agents = envs[0].possible_agents
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        rows = actions[steps % len(actions)]
        for i, env in enumerate(envs):
            if not env.agents:
                env.reset()
            env.step({a: rows[i * AGENTS + k] for k, a in enumerate(agents)})
        steps += 1
    return steps * len(envs) * AGENTS / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", type=int, default=1024, help="envs (each is 3 agents)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0, help="per configuration and round")
    parser.add_argument("--threads", type=int, default=2, help="envd's threaded configuration")
    args = parser.parse_args()
    from mpe2 import simple_spread_v3  # the reference: pip install mpe2

    warnings.simplefilter("ignore")
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 5, (64, args.envs * AGENTS), dtype=np.int64)
    serial = envd.make("simple_spread_v3", args.envs, seed=0, num_threads=0)
    threaded = envd.make("simple_spread_v3", args.envs, seed=0, num_threads=args.threads)
    refs = [simple_spread_v3.parallel_env() for _ in range(args.envs)]
    for env in (serial, threaded):
        env.reset()
    for i, env in enumerate(refs):
        env.reset(seed=i)
    configs = {
        "envd serial": lambda: envd_round(serial, actions, args.seconds),
        f"envd {args.threads} threads": lambda: envd_round(threaded, actions, args.seconds),
        "mpe2 Python loop": lambda: mpe2_round(refs, actions, args.seconds),
    }
    results: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(args.rounds):
        order = list(configs)
        random.shuffle(order)
        for name in order:
            results[name].append(configs[name]())
    base = statistics.median(results["mpe2 Python loop"])
    print(f"simple_spread_v3, {args.envs} envs x {AGENTS} agents, median of {args.rounds} "
          f"interleaved rounds; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    for name, values in results.items():
        median = statistics.median(values)
        print(f"  {name:20s} {median / 1e6:9.3f} M agent-steps/s  ({median / base:7.1f}x mpe2)")
    serial.close()
    threaded.close()
    for env in refs:
        env.close()


if __name__ == "__main__":
    main()
