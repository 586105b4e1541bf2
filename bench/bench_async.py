"""Async (send/recv, batch_size = N/2) versus sync stepping with a simulated learner.

The learner spends a fixed time per env step it receives (a stand-in for
policy inference), chosen so that learning on a batch takes as long as envd
takes to step it: T = (time of one sync step of N envs) / N per env step.  By
default the learner sleeps (a GPU-bound learner leaves the CPUs to the envs);
--learner spin holds a CPU instead, and then on a 2-CPU machine async cannot
win much: the envs lose the CPU the sync step used while the learner waited.
Sync:  step(all N), then learn on N.   Async: recv B, send them back, learn
on B while the other half is being stepped.  Measured for CartPole-v1 and
Acrobot-v1 at N=4096, in-process and through a daemon (started here; its
fast path and its socket path), and EnvPool's async mode when the optional `bench` extra is installed.
Target: async >= 1.5x sync when T matches the env time.

    python bench/bench_async.py [--num-envs 4096] [--seconds 1.0] [--rounds 3]
"""
from __future__ import annotations

import argparse
import gc
import os
import random
import time

import numpy as np

import envd
from bench_daemon import start_daemon  # noqa: E402  (same folder)


LEARNER = {"mode": "sleep"}


def busy(seconds: float) -> None:
    """The learner's work on a batch: a GPU-bound learner (sleep: the CPU is
    free for env stepping meanwhile) or a CPU-bound one (spin: it holds a CPU)."""
    end = time.perf_counter() + seconds
    if LEARNER["mode"] == "sleep":
        time.sleep(max(0.0, seconds - 60e-6))  # the sleep overshoots by ~60 us here
    while time.perf_counter() < end:
        pass


def sync_rate(env, actions: np.ndarray, learn_per_env: float, seconds: float) -> float:
    env.reset(seed=0)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.step(actions)
        busy(learn_per_env * len(actions))
        steps += len(actions)
    return steps / (time.perf_counter() - start)


def async_rate(env, actions: np.ndarray, learn_per_env: float, seconds: float) -> float:
    """EnvPool-style loop: recv B, send them straight back, learn on them."""
    env.async_reset()
    batch = len(actions)
    outstanding_batches = 2  # N = 2 B: every env is ready or in flight
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        info = env.recv()[4]
        env.send(actions, info["env_id"])
        busy(learn_per_env * batch)
        steps += batch
    rate = steps / (time.perf_counter() - start)
    for _ in range(outstanding_batches):  # receive what is in flight: EnvPool's
        env.recv()                       # async_reset crashes with sends pending
    return rate


def env_step_time(env, actions: np.ndarray) -> float:
    """Seconds per env step of a sync step of every env (median of 20)."""
    env.reset(seed=0)
    samples = []
    for _ in range(20):
        start = time.perf_counter()
        env.step(actions)
        samples.append(time.perf_counter() - start)
    return float(np.median(samples)) / len(actions)


def envpool_pair(env_id: str, n: int):
    try:
        import envpool
    except ImportError:
        return None
    cpus = len(os.sched_getaffinity(0))
    make = lambda b: envpool.make(env_id, env_type="gymnasium", num_envs=n, batch_size=b,  # noqa: E731
                                  num_threads=cpus)
    return make(n), make(n // 2)


class EnvPoolAdapter:
    """EnvPool's env with envd's call shapes (its recv info names env ids the same)."""

    def __init__(self, env):
        self.env = env

    def reset(self, seed=None):
        return self.env.reset()

    def step(self, actions):
        return self.env.step(actions)

    def async_reset(self):
        self.env.async_reset()

    def recv(self):
        return self.env.recv()

    def send(self, actions, env_ids):
        self.env.send(actions, env_ids)

    def close(self):
        self.env.close()


def measure(env_id: str, n: int, client: envd.Client, seconds: float, rounds: int) -> dict:
    # In-process async mode gets a worker per CPU: its calling thread is in the
    # learner, not helping to step (sync mode's default leaves one CPU to it).
    cpus = len(os.sched_getaffinity(0))
    pairs = {"in-process": (envd.make(env_id, n, seed=0),
                            envd.make(env_id, n, seed=0, batch_size=n // 2, num_threads=cpus)),
             "daemon, fast path": (client.make(env_id, n, seed=0),
                                   client.make(env_id, n, seed=0, batch_size=n // 2)),
             "daemon, socket": (client.make(env_id, n, seed=0, fast_path=False),
                                client.make(env_id, n, seed=0, batch_size=n // 2,
                                            fast_path=False))}
    pool = envpool_pair(env_id, n)
    if pool is not None:
        pairs["EnvPool"] = tuple(EnvPoolAdapter(e) for e in pool)
    space = pairs["in-process"][0].single_action_space
    rows = {}
    for name, (sync_env, async_env) in pairs.items():
        dtype = np.int32 if name == "EnvPool" else space.dtype
        full = np.zeros((n, *space.shape), dtype)
        half = np.zeros((n // 2, *space.shape), dtype)
        # T: what envd's own sync step costs per env (the same T for every row)
        learn = rows.get("_learn") or env_step_time(pairs["in-process"][0], full.astype(space.dtype))
        rows["_learn"] = learn
        best_sync = best_async = 0.0
        for _ in range(rounds):
            order = [("sync", sync_env, full), ("async", async_env, half)]
            random.shuffle(order)
            for kind, env, actions in order:
                gc.disable()
                try:
                    if kind == "sync":
                        best_sync = max(best_sync, sync_rate(env, actions, learn, seconds))
                    else:
                        best_async = max(best_async, async_rate(env, actions, learn, seconds))
                finally:
                    gc.enable()
        rows[name] = (best_sync, best_async)
        sync_env.close()
        async_env.close()
    return rows


def main() -> None:
    import tempfile
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=4096)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--learner", choices=["sleep", "spin"], default="sleep",
                        help="sleep: a GPU-bound learner (default); spin: one holding a CPU")
    args = parser.parse_args()
    LEARNER["mode"] = args.learner
    with tempfile.TemporaryDirectory(prefix="envd-bench-") as folder:
        proc, endpoint = start_daemon(folder, None)
        try:
            with envd.connect(endpoint) as client:
                results = {env_id: measure(env_id, args.num_envs, client, args.seconds, args.rounds)
                           for env_id in ("CartPole-v1", "Acrobot-v1")}
        finally:
            proc.terminate()
            proc.wait(60)
    print(f"N={args.num_envs}, batch_size={args.num_envs // 2}; learner ({args.learner}) time T "
          "per env step = envd's in-process sync step time per env; env steps per second "
          "(best of rounds)")
    for env_id, rows in results.items():
        learn = rows.pop("_learn")
        print(f"\n{env_id}  (T = {learn * 1e9:.0f} ns per env step)")
        print(f"{'system':<20}{'sync':>12}{'async':>12}{'async/sync':>12}")
        for name, (sync, asyn) in rows.items():
            target = "  (target >= 1.5x)" if name != "EnvPool" else ""
            print(f"{name:<20}{sync / 1e6:>11.3f}M{asyn / 1e6:>11.3f}M{asyn / sync:>11.2f}x{target}")


if __name__ == "__main__":
    main()
