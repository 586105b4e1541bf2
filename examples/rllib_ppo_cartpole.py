"""RLlib's PPO (new API stack) on CartPole-v1, its env runners stepping envd's
envs on the daemon of their own Ray node (envd.integrations.ray and .rllib).

    python examples/rllib_ppo_cartpole.py                  # a local Ray, --nodes simulated nodes
    python examples/rllib_ppo_cartpole.py --address auto   # an existing cluster

Trains until the mean return of RLlib's recent episodes reaches --target
(CartPole-v1's reward threshold, 475) and exits 1 if it does not within
--max-iterations (unless --no-require-solve).  Needs ``pip install
'envd-rl[rllib]'`` (and torch).
"""
from __future__ import annotations

import argparse
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--address", default=None,
                        help="Ray cluster to join (default: start a local one on 127.0.0.1)")
    parser.add_argument("--nodes", type=int, default=2,
                        help="daemons and env runners, one per Ray node (default 2)")
    parser.add_argument("--envs-per-runner", type=int, default=8)
    parser.add_argument("--target", type=float, default=475.0)
    parser.add_argument("--max-iterations", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-require-solve", action="store_true")
    args = parser.parse_args(argv)

    if args.address is None:
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # loopback only
    import ray
    from ray.rllib.algorithms.ppo import PPOConfig

    from envd.integrations.ray import start_daemons
    from envd.integrations.rllib import use_envd

    cluster = None
    if args.address is None:
        from ray.cluster_utils import Cluster
        cluster = Cluster(initialize_head=True,
                          head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1",
                                          "include_dashboard": False})
        for _ in range(args.nodes - 1):
            cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes()
    else:
        ray.init(address=args.address)
    start = time.monotonic()
    solved = False
    try:
        with start_daemons(args.nodes, threads=1, bundle={"CPU": 0.25}) as daemons:
            config = (use_envd(PPOConfig(), "CartPole-v1", daemons=daemons)
                      .env_runners(num_env_runners=args.nodes,
                                   num_envs_per_env_runner=args.envs_per_runner,
                                   num_cpus_per_env_runner=0.5)
                      .training(lr=3e-4, gamma=0.99, train_batch_size_per_learner=4000,
                                minibatch_size=256, num_epochs=10, vf_loss_coeff=0.01)
                      .debugging(seed=args.seed))
            algo = config.build_algo()
            try:
                for iteration in range(1, args.max_iterations + 1):
                    result = algo.train()
                    runners = result["env_runners"]
                    mean_return = runners.get("episode_return_mean", float("nan"))
                    print(f"iteration {iteration}: env steps "
                          f"{runners['num_env_steps_sampled_lifetime']}, mean return "
                          f"{mean_return:.1f}, {time.monotonic() - start:.0f} s", flush=True)
                    if mean_return >= args.target:
                        solved = True
                        break
                with daemons.connect(timeout=60) as client:
                    steps = [status["env_steps"] for status in client.status()]
                print(f"env steps per daemon: {steps}")
            finally:
                algo.stop()
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
    print(("solved" if solved else "not solved") + f" in {time.monotonic() - start:.0f} s")
    return 0 if solved or args.no_require_solve else 1


if __name__ == "__main__":
    sys.exit(main())
