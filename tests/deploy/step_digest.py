"""Step an env with fixed actions and print one JSON line: a SHA-256 of every
observation, reward, termination and truncation, and the transport the arrays
took.  tests/deploy/test_containers.py runs it in a trainer container against
the daemon container, and imports it for the same digest in-process: equal
digests mean bit-identical results.

    python step_digest.py --env-id CartPole-v1 --num-envs 64 --steps 200   # via ENVD_ENDPOINT
    python step_digest.py ... --in-process                                # envd.make
    python step_digest.py ... --hold                                      # keep the session

With ``--hold`` the session stays open after the line is printed, until the
process is killed or the daemon goes away: the segment it maps is then still in
/dev/shm for the test to look at.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time

import numpy as np

import envd


def actions_at(step: int, num_envs: int, space) -> np.ndarray:
    """Actions that depend only on (step, env): no RNG whose stream could
    differ between numpy versions on either side."""
    index = np.arange(num_envs)
    if hasattr(space, "n"):
        return ((step * 7 + index * 3) // 5 % space.n + space.start).astype(np.int64)
    wave = np.sin(0.1 * step + 0.7 * index).astype(np.float32)
    low, high = np.float32(space.low.flat[0]), np.float32(space.high.flat[0])
    return np.broadcast_to((low + (wave + 1) / 2 * (high - low))[:, None],
                           (num_envs, *space.shape)).astype(space.dtype)


def digest(env, steps: int, seed: int) -> str:
    """SHA-256 over reset's observations and every step's arrays, as stepped."""
    sha = hashlib.sha256()
    obs, _ = env.reset(seed=seed)
    sha.update(np.ascontiguousarray(obs).tobytes())
    for step in range(steps):
        obs, rew, term, trunc, _ = env.step(actions_at(step, env.num_envs,
                                                       env.single_action_space))
        for array in (obs, rew, term, trunc):
            sha.update(np.ascontiguousarray(array).tobytes())
    return sha.hexdigest()


def in_process_digest(env_id: str, num_envs: int, steps: int, seed: int) -> str:
    with envd.make(env_id, num_envs=num_envs, seed=seed) as env:
        return digest(env, steps, seed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env-id", default="CartPole-v1")
    parser.add_argument("--num-envs", type=int, default=64)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--in-process", action="store_true", help="envd.make, no daemon")
    parser.add_argument("--hold", action="store_true",
                        help="keep the session open after printing, until killed")
    parser.add_argument("--wait", type=float, default=60.0,
                        help="seconds to wait for the daemon to answer at start")
    args = parser.parse_args(argv)
    if args.in_process:
        print(json.dumps({"digest": in_process_digest(args.env_id, args.num_envs, args.steps,
                                                      args.seed), "transport": "in-process"}))
        return 0
    deadline = time.monotonic() + args.wait
    while True:
        try:
            client = envd.connect(os.environ.get("ENVD_ENDPOINT"), timeout=10.0)
            break
        except (envd.EnvdTimeoutError, envd.ConnectionLostError):
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.5)
    with client, client.make(args.env_id, num_envs=args.num_envs, seed=args.seed) as env:
        line = {"digest": digest(env, args.steps, args.seed), "transport": env.transport}
        print(json.dumps(line), flush=True)
        while args.hold:  # the heartbeat keeps the lease; the test kills this process
            time.sleep(1.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
