"""In-process stepping speed of envd.make versus gymnasium's numpy vector env.

Prints env steps per second of CartPole-v1 (or --env) for N in {1, 64, 1024,
4096}: envd with num_threads 0, 1, 2 and auto (None), and
gymnasium.make_vec(env, N, vectorization_mode="vector_entry_point") measured
in the same run, then the ratios the targets are stated in:

  - envd, 1 thread, N=1024  >= 4x gymnasium's numpy vector env
  - envd auto               >= 0.95x the best fixed thread setting, at every N
  - envd auto               >= 1.7x serial (threads=0) for a CPU-heavy env on
                               2 cores: --env ConnectFour-v0 --sizes 256 4096

Any built-in env takes --env; e.g. Snake-v0's serial cost per env step is
1e9 / (its threads=0 steps per second): --env Snake-v0 --sizes 1024 (a
speed, so measured here and not asserted by a unit test).

Machines are noisy: each configuration is measured in several rounds, in a
fresh random order each round and with the garbage collector paused, and the
best round is kept, so all rows see the same conditions.  Identical
configurations (auto is threads=1 on a 2-CPU machine) still differ by up to
~10% between runs on a shared VM; rerun before reading much into 0.9x-1.1x.

    python bench/bench_native.py [--env CartPole-v1] [--sizes 1 64 1024 4096]
                                 [--seconds 0.3] [--rounds 5]
"""
from __future__ import annotations

import argparse
import gc
import random
import time

import gymnasium as gym
import numpy as np

import envd

SIZES = [1, 64, 1024, 4096]
THREADS = [0, 1, 2, None]


def steps_per_second(env, actions: np.ndarray, seconds: float) -> float:
    """Env steps per second of env.step(actions) over about `seconds`."""
    env.step(actions)  # warm up (and let adaptive dispatch measure itself)
    calls, start = 0, time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(16):
            env.step(actions)
        calls += 16
        now = time.perf_counter()
        if now >= deadline:
            return calls * env.num_envs / (now - start)


def make_systems(env_id: str, n: int) -> dict[str, object]:
    systems = {}
    for threads in THREADS:
        name = f"envd threads={'auto' if threads is None else threads}"
        systems[name] = envd.make(env_id, n, seed=0, num_threads=threads)
    try:
        systems["gymnasium numpy vector"] = gym.make_vec(
            env_id, num_envs=n, vectorization_mode="vector_entry_point")
    except Exception as exc:  # noqa: BLE001 -- not every env has a numpy vector version
        print(f"(gymnasium vector_entry_point unavailable for {env_id}: {exc})")
    for env in systems.values():
        env.reset(seed=0)
    return systems


def measure(env_id: str, sizes: list[int], seconds: float,
            rounds: int) -> dict[str, dict[int, float]]:
    table: dict[str, dict[int, float]] = {}
    for n in sizes:
        systems = make_systems(env_id, n)
        actions = systems["envd threads=0"].action_space.sample()
        best = dict.fromkeys(systems, 0.0)
        order = list(systems)
        for _ in range(rounds):
            random.shuffle(order)
            for name in order:
                gc.disable()
                try:
                    best[name] = max(best[name], steps_per_second(systems[name], actions, seconds))
                finally:
                    gc.enable()
        for name, env in systems.items():
            table.setdefault(name, {})[n] = best[name]
            env.close()
        print(f"  measured N={n}", flush=True)
    return table


def report(env_id: str, sizes: list[int], table: dict[str, dict[int, float]]) -> None:
    print(f"\n{env_id}: env steps per second (best of rounds)")
    print(f"{'system':<26}" + "".join(f"{'N=' + str(n):>14}" for n in sizes))
    for name, row in table.items():
        print(f"{name:<26}" + "".join(f"{row[n] / 1e6:>13.3f}M" for n in sizes))
    print("\nratios")
    gym_row = table.get("gymnasium numpy vector")
    if gym_row and 1024 in sizes:
        ratio = table["envd threads=1"][1024] / gym_row[1024]
        print(f"  envd threads=1 / gymnasium numpy vector at N=1024: {ratio:6.2f}x  (target >= 4x)")
    fixed = [name for name in table if name.startswith("envd threads=") and "auto" not in name]
    for n in sizes:
        best_name = max(fixed, key=lambda name: table[name][n])
        ratio = table["envd threads=auto"][n] / table[best_name][n]
        print(f"  auto / best fixed ({best_name}) at N={n}: {ratio:6.2f}x  (target >= 0.95x)")
    for n in sizes:
        ratio = table["envd threads=auto"][n] / table["envd threads=0"][n]
        print(f"  auto / serial (threads=0) at N={n}: {ratio:6.2f}x  "
              "(target >= 1.7x on 2 cores for a CPU-heavy env such as ConnectFour-v0)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--sizes", type=int, nargs="+", default=SIZES, help="num_envs values")
    parser.add_argument("--seconds", type=float, default=0.3, help="per measurement")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"envd {envd.__version__}, auto = {envd.native.vector_env.default_num_threads()} "
          f"worker thread(s) + the calling thread")
    report(args.env, args.sizes, measure(args.env, args.sizes, args.seconds, args.rounds))


if __name__ == "__main__":
    main()
