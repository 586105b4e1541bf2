"""Agent-steps per second of the multi-agent built-in simple_spread_v3: envd
in-process (serial and with threads) and through a daemon (its own private
daemon with the same threads, the shm fast path), against mpe2 stepped the
way a SyncVectorEnv steps Python envs (a loop over N parallel envs, each
reset when its episode ends).

    python bench/bench_multi_agent.py --envs 1024 --rounds 5

The configurations are measured in interleaved rounds (src/envd/tools/
bench_rounds.py: every configuration once per round, in a shuffled order),
so load that comes and goes on a shared machine hits them alike.  Each line
gives the median round with half the min-max range (``±``), and its ratio to
mpe2 taken round by round; the load average is printed with them.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

import envd
from envd.tools.bench_python import hosting_daemon
from envd.tools.bench_rounds import interleaved_rounds, paired_ratios, ratio_text, spread_text

AGENTS = 3
MPE2 = "mpe2 Python loop"


def envd_round(env: Any, actions: np.ndarray, seconds: float) -> float:
    """Agent-steps/s of env (already reset) stepped for about `seconds`."""
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.step(actions[steps % len(actions)])
        steps += 1
    return steps * env.num_envs / (time.perf_counter() - start)


def mpe2_round(envs: list, actions: np.ndarray, seconds: float) -> float:
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


def configurations(stack: contextlib.ExitStack, envs: int, threads: int, seconds: float,
                   actions: np.ndarray) -> dict[str, Callable[[], float]]:
    """name -> one round's measurement; what they hold is closed by stack."""
    from mpe2 import simple_spread_v3  # the reference: pip install mpe2

    serial = stack.enter_context(envd.make("simple_spread_v3", envs, seed=0, num_threads=0))
    threaded = stack.enter_context(envd.make("simple_spread_v3", envs, seed=0,
                                             num_threads=threads))
    client = stack.enter_context(hosting_daemon((), threads=threads))
    served = stack.enter_context(client.make("simple_spread_v3", envs, seed=0))
    refs = [simple_spread_v3.parallel_env() for _ in range(envs)]
    for env in refs:
        stack.callback(env.close)
    for env in (serial, threaded, served):
        env.reset()
    for i, env in enumerate(refs):
        env.reset(seed=i)
    transport = f"{served.transport}{', fast path' if served.fast_path else ''}"
    return {
        "envd in-process serial": lambda: envd_round(serial, actions, seconds),
        f"envd in-process {threads} threads": lambda: envd_round(threaded, actions, seconds),
        f"envd daemon {threads} threads ({transport})":
            lambda: envd_round(served, actions, seconds),
        MPE2: lambda: mpe2_round(refs, actions, seconds),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", type=int, default=1024, help="envs (each is 3 agents)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0, help="per configuration and round")
    parser.add_argument("--threads", type=int, default=2,
                        help="threads of envd's threaded and daemon configurations")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 5, (64, args.envs * AGENTS), dtype=np.int64)
    with contextlib.ExitStack() as stack:
        configs = configurations(stack, args.envs, args.threads, args.seconds, actions)
        results = interleaved_rounds(list(configs), args.rounds, lambda name, _: configs[name]())
    print(f"simple_spread_v3, {args.envs} envs x {AGENTS} agents, {args.rounds} interleaved "
          f"rounds of {args.seconds:g} s; load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs (agent-steps/s: median ±half range; x mpe2 per round)")
    width = max(len(name) for name in results)
    for name, values in results.items():
        print(f"  {name:{width}s}  {spread_text(values):>12s}  "
              f"{ratio_text(paired_ratios(values, results[MPE2])):>14s} mpe2")


if __name__ == "__main__":
    main()
