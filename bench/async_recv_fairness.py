"""How long does an env wait between two recvs that return it (issue 20)?

Runs EnvPool's loop in-process (recv B envs, send zero actions straight back
under their ids) with two batches in flight, on a host as small as it gets:
this process and its pool pinned to one CPU (--cpus 1, the default), where
the pool's SCHED_BATCH worker runs only when the trainer blocks or is
preempted.  A cheap env's first batches go to the pool unmeasured and the
later ones run inline, so one batch can sit in the pool while the other
keeps coming back.

Prints, per env kind, the longest wait of any env: the most recvs in a row
that did not return it (1 means the two batches strictly took turns), and
the fewest and most recvs that returned an env.  It uses only the public
API, so it measures whatever envd the interpreter imports:

    python bench/async_recv_fairness.py [--recvs 3000] [--cpus 1] [--runs 3]
"""
from __future__ import annotations

import argparse
import os

import numpy as np

import envd


def longest_wait(env_id: str, num_envs: int, recvs: int) -> tuple[int, int, int]:
    """(the most recvs in a row without some env, fewest and most recvs of one env)."""
    env = envd.make(env_id, num_envs, seed=0, batch_size=num_envs // 2, num_threads=1)
    try:
        env.async_reset(seed=0)
        last_seen = np.zeros(num_envs, np.int64)
        received = np.zeros(num_envs, np.int64)
        worst = 0
        for k in range(1, recvs + 1):
            ids = env.recv()[4]["env_id"]
            waiting = np.ones(num_envs, bool)
            waiting[ids] = False
            worst = max(worst, int((k - last_seen[waiting]).max()))
            last_seen[ids] = k
            received[ids] += 1
            env.send(np.zeros(len(ids), np.int64), ids)
        return worst, int(received.min()), int(received.max())
    finally:
        env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recvs", type=int, default=3000)
    parser.add_argument("--cpus", type=int, default=1, help="CPUs to pin this process to")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--num-envs", type=int, default=12)
    args = parser.parse_args()
    # Before any env: the pool's worker inherits the pinning (and its spin
    # policy counts the CPUs it may use).
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:args.cpus])
    print(f"envd from {os.path.dirname(envd.__file__)}; {args.cpus} CPU(s), "
          f"{args.num_envs} envs, batches of {args.num_envs // 2}")
    for env_id in ("CartPole-v1", "Acrobot-v1"):
        for run in range(args.runs):
            worst, fewest, most = longest_wait(env_id, args.num_envs, args.recvs)
            print(f"{env_id:12} run {run + 1}: longest wait {worst:4d} recvs; "
                  f"recvs per env {fewest}..{most}")


if __name__ == "__main__":
    main()
