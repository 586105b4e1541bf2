"""Async (send/recv, batch_size = N/2) versus sync stepping with a simulated learner.

The same comparison as the learner section of `envd bench`
(src/envd/tools/bench_learner.py), alone and with more options: for each env,
envd in-process, envd through a daemon started here (its default path on this
host) and EnvPool when it imports, each in sync mode (step N, learn on N) and
async mode (recv B, send B, learn on B), with a sleeping learner (GPU-bound)
and a busy one (a CPU loop), the learner taking T per env step, T = one envd
in-process sync step of N envs / N.  Every configuration of an env is
measured once per round, rounds interleaved; the figures are medians over
rounds with half their min-max range, the async/sync ratios per round.
Targets (issue 20, sleeping learner): >= 1.6x for Acrobot-v1 and
ConnectFour-v0, >= 1.0x for CartPole-v1, and ahead of EnvPool's own ratio.

    python bench/bench_async.py [--num-envs 4096] [--seconds 0.5] [--rounds 5]
                                [--envs CartPole-v1 Acrobot-v1 ConnectFour-v0]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import warnings

from bench_daemon import start_daemon  # same folder

import envd
from envd.tools import bench_learner, bench_load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=4096, help="N (even); batch N/2")
    parser.add_argument("--seconds", type=float, default=0.5, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--envs", nargs="+", default=list(bench_learner.LEARNER_ENVS))
    args = parser.parse_args()
    if args.num_envs < 2 or args.num_envs % 2:
        parser.error("--num-envs must be even and >= 2")
    # EnvPool's spaces make gymnasium warn about float64 bounds cast to float32.
    warnings.filterwarnings("ignore", message=".*precision lowered by casting")
    before = bench_load.sample()
    with tempfile.TemporaryDirectory(prefix="envd-bench-") as folder:
        proc, endpoint = start_daemon(folder, None)
        try:
            with envd.connect(endpoint) as client:
                results = {env_id: bench_learner.measure_env(env_id, args.num_envs, client,
                                                             args.rounds, args.seconds)
                           for env_id in args.envs}
        finally:
            proc.terminate()
            proc.wait(60)
    after = bench_load.sample()
    print("env steps per second: median of rounds, ± half their range; async/sync per round")
    print("\n".join(bench_learner.report_lines(results)))
    print("\ntargets (NOT JUDGED: the spread over rounds is wider than the margin)")
    for target in bench_learner.targets(results):
        print(f"  {target['status']:<10}  {target['target']}: {target['detail']}")
    if before and after:
        warning = bench_load.assess(before, after, len(os.sched_getaffinity(0)))
        print(f"\n{warning.warning() or 'machine load: quiet'}")


if __name__ == "__main__":
    main()
