"""A stand-in trainer for the container examples: step CartPole-v1 through a
daemon with random actions and print env steps per second.

It connects where ``ENVD_ENDPOINT`` points (docker-compose.yml and the
Kubernetes manifests in deploy/k8s set it), with the CURVE keys of
``ENVD_SERVER_KEY`` / ``ENVD_CLIENT_KEY`` when the endpoint is tcp; a
``dns+tcp://NAME:PORT`` endpoint spreads the envs over every daemon NAME
resolves to.  It waits up to ``--wait`` seconds for the daemon to answer, so it
may start alongside it.  The last line says which transport the arrays took:
``shm`` (zero-copy: same host, IPC namespace and uid as the daemon) or
``inline`` (over the socket).

    python examples/compose_trainer.py --num-envs 1024 --steps 2000
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

import envd


def connect(endpoint: str | None, wait: float):
    """envd.connect, retried until the daemon answers or wait seconds pass."""
    deadline = time.monotonic() + wait
    while True:
        try:
            return envd.connect(endpoint, timeout=10.0)
        except (envd.EnvdTimeoutError, envd.ConnectionLostError) as exc:
            if time.monotonic() >= deadline:
                raise
            print(f"waiting for the daemon: {exc}", file=sys.stderr, flush=True)
            time.sleep(1.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", default=None,
                        help="daemon endpoint (default: ENVD_ENDPOINT, else the default socket)")
    parser.add_argument("--env-id", default="CartPole-v1")
    parser.add_argument("--num-envs", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=2000, help="vector steps to take")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--wait", type=float, default=60.0,
                        help="seconds to wait for the daemon to answer at start")
    args = parser.parse_args(argv)

    # Passed on explicitly: envd.connect expands a dns+tcp:// endpoint (every
    # daemon behind a headless Service) given as its argument.
    endpoint = args.endpoint or os.environ.get("ENVD_ENDPOINT") or None
    print(f"connecting to {endpoint or 'the default endpoint'}", flush=True)
    rng = np.random.default_rng(args.seed)
    with connect(endpoint, args.wait) as client, \
            client.make(args.env_id, num_envs=args.num_envs, seed=args.seed) as env:
        env.reset()
        space = env.single_action_space
        discrete = hasattr(space, "n")
        episodes, returns = 0, 0.0
        start = time.perf_counter()
        for _ in range(args.steps):
            actions = (rng.integers(0, space.n, size=env.num_envs) + space.start
                       if discrete else env.action_space.sample())
            _, _, _, _, info = env.step(actions)
            if "envd_episode" in info:
                done = info["_envd_episode"]
                episodes += int(done.sum())
                returns += float(info["envd_episode"]["r"][done].sum())
        elapsed = time.perf_counter() - start
        transport = getattr(env, "transport", "?")
    rate = args.steps * args.num_envs / elapsed
    mean = returns / episodes if episodes else float("nan")
    print(f"{args.env_id}: {args.steps} steps x {args.num_envs} envs in {elapsed:.2f} s = "
          f"{rate:,.0f} env steps/s; {episodes} episodes, mean return {mean:.1f}; "
          f"transport {transport}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
