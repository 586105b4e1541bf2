"""What copy=True costs: envd's views against the copies gymnasium.make_vec
returns by default (docs/gymnasium.md, "Views or copies").

Steps CartPole-v1 (or --env) in-process with copy=False (envd.make's default:
views of envd's buffers) and copy=True (gymnasium.make_vec("envd/...")'s
default: new arrays each step), N in {16, 4096}, measured side by side in
interleaved rounds with the garbage collector paused, and prints env steps per
second (the median round) and the ratio copy/views taken round by round.
--endpoint measures a daemon's env instead (client.make).

    python bench/bench_copy.py [--env CartPole-v1] [--sizes 16 4096]
                               [--seconds 0.5] [--rounds 7] [--endpoint ipc://...]
"""
from __future__ import annotations

import argparse
import gc
import random
import statistics
import time

import numpy as np

import envd


def steps_per_second(env, actions: np.ndarray, seconds: float) -> float:
    """Env steps per second of env.step(actions) over about `seconds`."""
    env.step(actions)
    calls, start = 0, time.perf_counter()
    while True:
        for _ in range(16):
            env.step(actions)
        calls += 16
        now = time.perf_counter()
        if now - start >= seconds:
            return calls * env.num_envs / (now - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 4096])
    parser.add_argument("--seconds", type=float, default=0.5)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--endpoint", default=None, help="measure this daemon's env")
    args = parser.parse_args()
    client = envd.connect(args.endpoint) if args.endpoint else None
    maker = client.make if client else envd.make
    print(f"{args.env}, {'daemon ' + args.endpoint if client else 'in-process'}, "
          f"{args.rounds} rounds of {args.seconds} s, env steps/s (median round)")
    print(f"{'N':>6} | {'views (copy=False)':>18} | {'copies (copy=True)':>18} | copies/views")
    for n in args.sizes:
        envs = {False: maker(args.env, n, seed=0, copy=False),
                True: maker(args.env, n, seed=0, copy=True)}
        for env in envs.values():
            env.reset(seed=0)
        actions = envs[False].action_space.sample()
        runs: dict[bool, list[float]] = {False: [], True: []}
        gc.disable()
        try:
            for _ in range(args.rounds):
                for copy in random.sample([False, True], 2):
                    runs[copy].append(steps_per_second(envs[copy], actions, args.seconds))
        finally:
            gc.enable()
        ratios = [c / v for c, v in zip(runs[True], runs[False])]
        print(f"{n:>6} | {statistics.median(runs[False]):>18,.0f} | "
              f"{statistics.median(runs[True]):>18,.0f} | {statistics.median(ratios):.2f}x "
              f"(rounds {min(ratios):.2f}-{max(ratios):.2f})")
        for env in envs.values():
            env.close()
    if client:
        client.close()


if __name__ == "__main__":
    main()
