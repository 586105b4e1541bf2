"""Stable-Baselines3 PPO on CartPole-v1 through an envd daemon, via envd.integrations.sb3.

Start a daemon, then train through it:

    envd --threads 1 --bind ipc:///tmp/envd-ppo/envd.sock &
    python examples/sb3_ppo_cartpole.py --endpoint ipc:///tmp/envd-ppo/envd.sock

(``--in-process`` steps the envs in this process instead.)  ``EnvdVecEnv``
makes the daemon's envs an SB3 ``VecEnv``; SB3's logger reports
``rollout/ep_rew_mean`` from envd's episode statistics.  The hyper-parameters
are rl-baselines3-zoo's for CartPole-v1 (8 envs, 32 steps, batch 256, 20
epochs, gamma 0.98, GAE lambda 0.8, learning rate and clip range annealed
linearly from 1e-3 and 0.2).  At the end the deterministic policy is evaluated
with SB3's ``evaluate_policy`` on separate envs from the same daemon; the last
line gives the steps, wall time, the last ep_rew_mean and the evaluation.

Measured on the 2-core development box (shared with other work), SB3 2.9.2,
torch 2.13.0 CPU with one torch thread, against ``envd --threads 1`` over ipc:

    python examples/sb3_ppo_cartpole.py --endpoint ipc:///tmp/envd-ppo/envd.sock --seed 0
    -> RESULT seed=0 steps=100096 wall_s=145.2 steps_per_s=689 ep_rew_mean=500.0
       eval_mean_return=500.0 eval_std=0.0 eval_episodes=10

ep_rew_mean (SB3's mean over the last 100 episodes) passed 474 at 61k steps and
stayed at 500 from 72k steps on; SB3's per-step overhead, not envd, sets the pace.
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.evaluation import evaluate_policy

import envd
from envd.integrations.sb3 import EnvdVecEnv


def linear(start: float):
    """SB3 schedule: start at the beginning of training, 0 at the end."""
    return lambda progress_remaining: progress_remaining * start


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--endpoint", default=None,
                   help="the daemon's endpoint (default: ENVD_ENDPOINT, else envd's default ipc socket)")
    p.add_argument("--in-process", action="store_true",
                   help="step the envs in this process (envd.make) instead of a daemon")
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--total-steps", type=int, default=100_000, help="SB3's total_timesteps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-episodes", type=int, default=10)
    p.add_argument("--log-interval", type=int, default=40,
                   help="PPO iterations between SB3's progress tables")
    p.add_argument("--torch-threads", type=int, default=1)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.torch_threads)
    client = None if args.in_process else envd.connect(args.endpoint)
    where = "in-process" if client is None else f"daemon at {client.endpoint}"
    print(f"SB3 PPO CartPole-v1: {args.num_envs} envs ({where}), seed {args.seed}, "
          f"{args.total_steps:,} steps", flush=True)
    try:
        venv = EnvdVecEnv.make("CartPole-v1", args.num_envs, client=client, seed=args.seed)
        model = PPO("MlpPolicy", venv, n_steps=32, batch_size=256, n_epochs=20, gamma=0.98,
                    gae_lambda=0.8, ent_coef=0.0, learning_rate=linear(1e-3),
                    clip_range=linear(0.2), seed=args.seed, device="cpu", verbose=1)
        start = time.perf_counter()
        model.learn(total_timesteps=args.total_steps, log_interval=args.log_interval)
        wall = time.perf_counter() - start
        train_mean = (float(np.mean([ep["r"] for ep in model.ep_info_buffer]))
                      if model.ep_info_buffer else float("nan"))
        venv.close()

        eval_env = EnvdVecEnv.make("CartPole-v1", 1, client=client, seed=args.seed + 10_000)
        # EnvdVecEnv writes Monitor's info["episode"] from envd's statistics and
        # says so (env_is_wrapped(Monitor)): evaluate_policy reads the returns there.
        eval_mean, eval_std = evaluate_policy(model, eval_env, n_eval_episodes=args.eval_episodes,
                                              deterministic=True)
        eval_env.close()
    finally:
        if client is not None:
            client.close()
    print(f"RESULT seed={args.seed} steps={model.num_timesteps} wall_s={wall:.1f} "
          f"steps_per_s={model.num_timesteps / wall:.0f} ep_rew_mean={train_mean:.1f} "
          f"eval_mean_return={eval_mean:.1f} eval_std={eval_std:.1f} "
          f"eval_episodes={args.eval_episodes}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
