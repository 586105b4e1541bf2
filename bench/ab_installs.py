"""Two installs of envd side by side: is a change faster or slower?

Runs the same workloads with two Python interpreters (e.g. the virtualenv of
main and the one of a branch), alternating them round by round (A, B, A, B,
...) so that both see the same machine, and prints per-workload medians and
the B/A ratio of each round (median and range).  Each interpreter has its own
daemon, started at the beginning and idle while the other one measures.

    python bench/ab_installs.py /path/to/venv-a/bin/python /path/to/venv-b/bin/python \
        [--rounds 7] [--seconds 0.5] [--only "2 daemons"]

Workloads (N = 4096 unless said): in-process sync steps of CartPole-v1 and
Acrobot-v1; in-process async CartPole-v1 (batch 2048, send/recv); the
daemon's fast path and socket path, CartPole-v1 sync; the daemon's async
CartPole-v1 (batch 2048), and with 64 envs in batches of 32 over the socket
and through the doorbell (the per-call cost); hosted Python envs, N = 16:
a no-op env with 0, 1 and 2 workers (its step costs nothing, so the rate is
envd's own per-step cost: the worker loop, the wake-ups, the info merge)
and Acrobot-v1 with 2 workers; over two daemons (envd.connect([a, b])),
CartPole-v1 sync (N = 4096 and 64) and async (batch 2048), and 64 envs in batches of 32 over
the sockets and through the doorbells.  Public API only, so any two versions
compare.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Run inside each interpreter: measures every workload once, prints JSON.
WORKER = r"""
import json, sys, time
import gymnasium as gym
import numpy as np
import envd

endpoint, second_endpoint, seconds, only = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]

def rate(call, envs_per_call):
    call()  # warm up
    calls, start = 0, time.perf_counter()
    while True:
        for _ in range(8):
            call()
        calls += 8
        now = time.perf_counter()
        if now - start >= seconds:
            return calls * envs_per_call / (now - start)

def sync(env):
    actions = np.zeros(env.action_space.shape, env.action_space.dtype)
    env.reset(seed=0)
    return rate(lambda: env.step(actions), env.num_envs)

def asynchronous(env, batch):
    env.async_reset(seed=0)
    actions = np.zeros((batch,) + env.single_action_space.shape, env.single_action_space.dtype)
    def once():
        obs, rew, term, trunc, info = env.recv()
        env.send(actions, info["env_id"])
    return rate(once, batch)

class NoopEnv(gym.Env):
    # A hosted env whose step costs nothing (cloudpickled by value from here).
    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(4, np.float32), {}

    def step(self, action):
        return np.zeros(4, np.float32), 0.0, False, False, {}

out = {}

def measure(name, make, run):
    # run(env) of the env make() returns, as workload name (unless --only leaves it out)
    if only in name:
        with make() as env:
            out[name] = run(env)

for workers in (0, 1, 2):
    measure(f"hosted no-op N=16, {workers} workers",
            lambda: envd.make(NoopEnv, 16, num_workers=workers), sync)
measure("hosted Acrobot N=16, 2 workers",
        lambda: envd.make("py:Acrobot-v1", 16, num_workers=2), sync)
measure("in-process CartPole sync", lambda: envd.make("CartPole-v1", 4096, seed=0), sync)
measure("in-process Acrobot sync", lambda: envd.make("Acrobot-v1", 4096, seed=0), sync)
measure("in-process CartPole async",
        lambda: envd.make("CartPole-v1", 4096, seed=0, batch_size=2048),
        lambda env: asynchronous(env, 2048))
with envd.connect(endpoint) as client:
    with client.make("CartPole-v1", 1) as probe:
        fast = probe.fast_path  # (where the daemon offers it and this host can)
    measure("daemon CartPole sync (default path)",
            lambda: client.make("CartPole-v1", 4096, seed=0), sync)
    measure("daemon CartPole sync (socket)",
            lambda: client.make("CartPole-v1", 4096, seed=0, fast_path=False), sync)
    measure("daemon CartPole async",
            lambda: client.make("CartPole-v1", 4096, seed=0, batch_size=2048),
            lambda env: asynchronous(env, 2048))
    # small batches: the per-call cost of the async path (a posted send and a
    # recv over the socket, or two doorbell rings) dominates
    measure("daemon CartPole async B=32 (socket)",
            lambda: client.make("CartPole-v1", 64, seed=0, batch_size=32, fast_path=False),
            lambda env: asynchronous(env, 32))
    if fast:
        measure("daemon CartPole async B=32 (doorbell)",
                lambda: client.make("CartPole-v1", 64, seed=0, batch_size=32, fast_path=True),
                lambda env: asynchronous(env, 32))
# two daemons as one env: the multi-daemon client's own cost
with envd.connect([endpoint, second_endpoint]) as multi:
    measure("2 daemons CartPole sync", lambda: multi.make("CartPole-v1", 4096, seed=0), sync)
    # few envs: the per-step cost of driving two daemons (posts and waits)
    measure("2 daemons CartPole sync N=64", lambda: multi.make("CartPole-v1", 64, seed=0), sync)
    measure("2 daemons CartPole async",
            lambda: multi.make("CartPole-v1", 4096, seed=0, batch_size=2048),
            lambda env: asynchronous(env, 2048))
    measure("2 daemons CartPole async B=32 (socket)",
            lambda: multi.make("CartPole-v1", 64, seed=0, batch_size=32, fast_path=False),
            lambda env: asynchronous(env, 32))
    if fast:
        measure("2 daemons CartPole async B=32 (doorbell)",
                lambda: multi.make("CartPole-v1", 64, seed=0, batch_size=32, fast_path=True),
                lambda env: asynchronous(env, 32))
print(json.dumps(out))
"""


def rate_text(rate: float) -> str:
    """A rate in millions of env steps per second, or thousands below a million
    (a hosted Python env's)."""
    return f"{rate / 1e6:.2f}M" if rate >= 1e6 else f"{rate / 1e3:.1f}k"


def start_daemon(python: str, folder: Path) -> tuple[subprocess.Popen, str]:
    folder.mkdir()
    endpoint = f"ipc://{folder}/envd.sock"
    proc = subprocess.Popen([python, "-m", "envd", "--threads", "2", "--bind", endpoint],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            cwd=folder)
    deadline = time.monotonic() + 60
    while not (folder / "envd.sock").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the daemon of {python} did not start")
        time.sleep(0.05)
    return proc, endpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("python_a")
    parser.add_argument("python_b")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=0.5)
    parser.add_argument("--only", default="",
                        help="measure only the workloads whose name contains this")
    args = parser.parse_args()
    pythons = {"A": args.python_a, "B": args.python_b}
    results: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
    with tempfile.TemporaryDirectory() as tmp:
        # two daemons per install (the multi-daemon rows use both; the
        # second idles through the one-daemon rows)
        daemons: dict[str, list[tuple[subprocess.Popen, str]]] = {name: [] for name in pythons}
        try:
            for name, python in pythons.items():
                for k in range(2):
                    daemons[name].append(start_daemon(python, Path(tmp) / f"{name}{k}"))
            for round_index in range(args.rounds):
                order = ["A", "B"] if round_index % 2 == 0 else ["B", "A"]
                for name in order:
                    run = subprocess.run(
                        [pythons[name], "-c", WORKER, daemons[name][0][1], daemons[name][1][1],
                         str(args.seconds), args.only],
                        capture_output=True, text=True, cwd=tmp, check=True)
                    results[name].append(json.loads(run.stdout))
                print(f"round {round_index + 1}/{args.rounds} done", file=sys.stderr)
        finally:
            for proc, _ in [daemon for pair in daemons.values() for daemon in pair]:
                proc.send_signal(signal.SIGTERM)
            for proc, _ in [daemon for pair in daemons.values() for daemon in pair]:
                proc.wait(timeout=60)
    print(f"A = {args.python_a}\nB = {args.python_b}\n"
          f"{args.rounds} rounds, alternating; env steps per second, median over rounds; "
          f"load average at the end {os.getloadavg()[0]:.2f} on "
          f"{len(os.sched_getaffinity(0))} CPUs")
    print(f"{'workload':40} {'A':>10} {'B':>10} {'B/A median':>11} {'B/A range':>14}")
    for key in results["A"][0]:
        a = [r[key] for r in results["A"]]
        b = [r[key] for r in results["B"]]
        ratios = [y / x for x, y in zip(a, b)]
        print(f"{key:40} {rate_text(statistics.median(a)):>10} {rate_text(statistics.median(b)):>10} "
              f"{statistics.median(ratios):10.2f}x {min(ratios):6.2f}-{max(ratios):.2f}x")


if __name__ == "__main__":
    main()
