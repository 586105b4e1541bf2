"""Do one client's large async batches starve another client's small steps?

Starts a daemon, then measures a small client (CartPole-v1, N=64, sync
steps; and Acrobot-v1, N=256, async with batch_size=128) alone, and again while
a heavy client in another process keeps large async batches of Acrobot-v1
(N=65536, batch_size=32768) in flight.  Prints the small client's steps per
second and step latency p50/p99 in both cases; the pool serves jobs in
submit order, so a small job waits at most for the chunks of one large job
that were already claimed, not for the whole large batch queue.

    python bench/bench_fairness.py [--seconds 3]
"""
from __future__ import annotations

import argparse
import multiprocessing
import tempfile
import time

import numpy as np
from bench_daemon import start_daemon  # same folder

import envd


def heavy_client(endpoint: str, stop) -> None:
    with envd.connect(endpoint) as client:
        env = client.make("Acrobot-v1", 65536, seed=0, batch_size=32768)
        env.async_reset()
        actions = np.zeros(32768, np.int64)
        while not stop.is_set():
            info = env.recv()[4]
            env.send(actions, info["env_id"])


def small_client(client: envd.Client, seconds: float) -> dict[str, tuple[float, float, float]]:
    results = {}
    with client.make("CartPole-v1", 64, seed=0) as env:
        env.reset()
        actions = np.zeros(64, np.int64)
        times = []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            start = time.perf_counter()
            env.step(actions)
            times.append(time.perf_counter() - start)
        results["CartPole-v1 N=64 sync step"] = (64 / np.mean(times), *np.percentile(times, [50, 99]))
    with client.make("Acrobot-v1", 256, seed=0, batch_size=128) as env:
        env.async_reset()
        actions = np.zeros(128, np.int64)
        times = []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            start = time.perf_counter()
            info = env.recv()[4]
            env.send(actions, info["env_id"])
            times.append(time.perf_counter() - start)
        results["Acrobot-v1 N=256 B=128 recv+send"] = (128 / np.mean(times),
                                                         *np.percentile(times, [50, 99]))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="envd-bench-") as folder:
        proc, endpoint = start_daemon(folder, None)
        try:
            with envd.connect(endpoint) as client:
                alone = small_client(client, args.seconds)
                stop = multiprocessing.Event()
                heavy = multiprocessing.Process(target=heavy_client, args=(endpoint, stop))
                heavy.start()
                time.sleep(2.0)  # let the heavy client reach its steady state
                shared = small_client(client, args.seconds)
                stop.set()
                heavy.join(60)
        finally:
            proc.terminate()
            proc.wait(60)
    print("small client alone vs. next to a client with 32768-env async batches in flight")
    for name in alone:
        (rate_a, p50_a, p99_a), (rate_s, p50_s, p99_s) = alone[name], shared[name]
        print(f"{name}:\n  alone   {rate_a / 1e3:9.1f}k steps/s  p50 {p50_a * 1e6:7.0f} us  "
              f"p99 {p99_a * 1e6:7.0f} us\n  shared  {rate_s / 1e3:9.1f}k steps/s  p50 "
              f"{p50_s * 1e6:7.0f} us  p99 {p99_s * 1e6:7.0f} us  ({rate_s / rate_a:.2f}x)")


if __name__ == "__main__":
    main()
