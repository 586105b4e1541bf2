"""Hosted Python envs against gymnasium's SyncVectorEnv, side by side in one run.

    python bench/hosted_python.py [--env Acrobot-v1] [--num-envs 16] [--rounds 3]
    python bench/hosted_python.py --overhead    # the per-step round trip, a no-op env
    python bench/hosted_python.py --daemon      # also through a daemon it starts
                                                # (--python-env <env>), fast path and
                                                # socket, and their N=1 round trips
                                                # (p50, p99)

Each round steps every contender for --seconds with random (pre-drawn)
actions, in turn (rounds interleave the contenders), and prints steps/s per contender and round: gymnasium
SyncVectorEnv and AsyncVectorEnv(shared_memory=True), then
envd.make("py:<id>") with num_workers 0, 1, 2 and the default (and with
--daemon, client.make("py:<id>", num_workers=2) through a daemon started as
``envd bench --python`` starts its own, on the fast path and over the socket,
and their ratio to in-process with 2 workers).  A measurement, not a test:
run it on a quiet machine.  ``envd bench --python`` is the whole comparison
(the parallel ceiling, PufferLib, SB3, targets, spread, plot); this script is
a quick look at one env and N.
"""
from __future__ import annotations

import argparse
import contextlib
import time

import gymnasium as gym
import numpy as np

import envd
from envd.tools.bench_python import hosting_daemon


def rate(env, actions: np.ndarray, seconds: float) -> float:
    env.reset(seed=0)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.step(actions[steps % len(actions)])
        steps += 1
    return steps * env.num_envs / (time.perf_counter() - start)


class NoopEnv(gym.Env):
    """An env whose step costs nothing: what remains is envd's round trip."""
    observation_space = gym.spaces.Box(0, 1, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return np.zeros(4, np.float32), {}

    def step(self, action):
        return np.zeros(4, np.float32), 0.0, False, False, {}


def overhead(rounds: int, steps: int = 3000) -> None:
    print("no-op env, N=2: us per step (rounds)")
    envs = {w: envd.make(NoopEnv, 2, num_workers=w) for w in (0, 1, 2)}
    times: dict[int, list[float]] = {w: [] for w in envs}
    actions = np.zeros(2, np.int64)
    for _ in range(rounds):
        for w, env in envs.items():
            env.reset(seed=0)
            start = time.perf_counter()
            for _ in range(steps):
                env.step(actions)
            times[w].append((time.perf_counter() - start) / steps * 1e6)
    for w, env in envs.items():
        print(f"  num_workers={w}  " + "  ".join(f"{t:7.1f}" for t in times[w]))
        env.close()


def round_trips(env, steps: int = 3000) -> tuple[float, float]:
    """(p50, p99) microseconds of one step of a 1-env env."""
    env.reset(seed=0)
    actions = np.zeros((1, *env.single_action_space.shape), env.single_action_space.dtype)
    times = np.empty(steps)
    for i in range(steps):
        start = time.perf_counter()
        env.step(actions)
        times[i] = time.perf_counter() - start
    return float(np.percentile(times, 50) * 1e6), float(np.percentile(times, 99) * 1e6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="Acrobot-v1")
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--overhead", action="store_true",
                        help="measure the round trip of a no-op env instead")
    parser.add_argument("--daemon", action="store_true",
                        help="also step the env through a daemon (2 workers), and time "
                             "its N=1 round trip")
    args = parser.parse_args()
    if args.overhead:
        return overhead(args.rounds)
    with contextlib.ExitStack() as stack:
        client = stack.enter_context(hosting_daemon((args.env,))) if args.daemon else None
        measure(args, client)


def measure(args: argparse.Namespace, client) -> None:
    n = args.num_envs
    contenders = {"gymnasium sync": gym.make_vec(args.env, n, vectorization_mode="sync"),
                  "gymnasium async (shm)": gym.make_vec(
                      args.env, n, vectorization_mode="async",
                      vector_kwargs={"shared_memory": True})}
    for workers in (0, 1, 2):
        contenders[f"envd workers={workers}"] = envd.make("py:" + args.env, n,
                                                          num_workers=workers)
    default = envd.make("py:" + args.env, n)
    contenders[f"envd default ({default.num_workers})"] = default
    if client is not None:
        contenders["envd daemon workers=2"] = client.make("py:" + args.env, n, num_workers=2,
                                                          fast_path=True)
        contenders["envd daemon socket"] = client.make("py:" + args.env, n, num_workers=2,
                                                       fast_path=False)
    space = contenders["gymnasium sync"].action_space
    space.seed(0)
    actions = np.stack([space.sample() for _ in range(256)])
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(args.rounds):  # interleaved: a load change hits every contender
        for name, env in contenders.items():
            rates[name].append(rate(env, actions, args.seconds))
    print(f"{args.env}, N={n}: env steps/s per round (median last)")
    for name, values in rates.items():
        print(f"  {name:24s} " + "  ".join(f"{r:10,.0f}" for r in values)
              + f"   | {np.median(values):10,.0f}")
    if client is not None:
        in_process = np.median(rates["envd workers=2"])
        for name in ("envd daemon workers=2", "envd daemon socket"):
            print(f"  {name} / envd workers=2 (in-process): "
                  f"{np.median(rates[name]) / in_process:.2f}x")
    for env in contenders.values():
        env.close()
    if client is not None:
        for path, fast in (("fast path", True), ("socket", False)):
            with client.make("py:" + args.env, 1, num_workers=1, fast_path=fast) as env:
                p50, p99 = round_trips(env)
            print(f"  daemon N=1 round trip ({path}): p50 {p50:.0f} us, p99 {p99:.0f} us")


if __name__ == "__main__":
    main()
