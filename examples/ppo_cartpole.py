"""PPO on CartPole-v1 through an envd daemon (CleanRL style; the algorithm is ppo_core.py).

Start a daemon, then train through it:

    envd --threads 1 --bind ipc:///tmp/envd-ppo/envd.sock &
    python examples/ppo_cartpole.py --endpoint ipc:///tmp/envd-ppo/envd.sock

or without a daemon (the same native envs in this process, same results):

    python examples/ppo_cartpole.py --in-process

The algorithm (ppo_core.py, shared with ppo_simple_spread.py): a 64-64 tanh
actor and critic, rollouts of num_steps x num_envs, GAE(lambda), the clipped
surrogate objective, Adam with a linearly annealed learning rate.  The envs run
in envd's ``same_step`` autoreset mode: the final observation
(``info["final_obs"]``) bootstraps the value of an episode cut by the time
limit, and episode returns come from envd's own episode statistics
(``info["envd_episode"]["r"]`` under the mask ``info["_envd_episode"]``).

"Solved" means: the mean return of the last 20 finished episodes is at least
475 (``--target``).  Training stops as soon as that holds; the last line says
whether it did, at which step, with which mean return, and the wall time.  The
exit status is 1 when the target was not reached within ``--total-steps``,
unless ``--no-require-solve`` (short runs, smoke tests).

Measured on the 2-core development box (shared with other work), torch 2.13.0
CPU with one torch thread, against ``envd --threads 1`` over ipc, defaults
(8 envs, budget 150,000 steps):

    python examples/ppo_cartpole.py --endpoint ipc:///tmp/envd-ppo/envd.sock --seed 1
    -> RESULT solved=True seed=1 steps=39936 episodes=227 mean_return=478.5 wall_s=21.2

(wall time from the first reset, without Python's and torch's start-up).  Seeds
2-5 solved in 71,168, 58,880, 40,448 and 60,416 steps: see examples/README.md.
``--in-process`` gives the same steps, episodes and returns (envd's envs are
bit-identical in and out of the daemon).
"""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from gymnasium.vector import VectorEnv
from ppo_core import PPO, Episodes

import envd


@dataclass
class Config:
    """PPO's hyper-parameters (the defaults solve CartPole-v1; see the docstring)."""
    num_envs: int = 8
    total_steps: int = 150_000    # env steps (all envs together): the budget
    seed: int = 1
    num_steps: int = 64           # steps per env per rollout
    learning_rate: float = 1e-3   # annealed linearly to 0 over total_steps
    gamma: float = 0.99
    gae_lambda: float = 0.95
    num_minibatches: int = 4
    update_epochs: int = 10
    clip_coef: float = 0.2
    vf_coef: float = 0.5
    ent_coef: float = 0.0
    max_grad_norm: float = 0.5
    target: float = 475.0         # "solved": mean return of the last `window` episodes
    window: int = 20
    log_every: int = 10           # updates between progress lines (0: none)


@dataclass
class Result:
    """What a training run measured."""
    solved: bool
    steps: int                    # env steps taken (all envs together)
    wall_s: float
    mean_return: float            # over the last `window` finished episodes (nan if none)
    episodes: int                 # finished episodes
    steps_per_s: float
    losses_finite: bool           # every loss of every minibatch was finite
    returns: list[float] = field(default_factory=list)  # the last `window` episode returns


def train(env: VectorEnv, cfg: Config, log: Callable[[str], None] = print) -> Result:
    """Train PPO (ppo_core.py) on env, a gymnasium VectorEnv from envd made
    with autoreset_mode="same_step" (in-process or served by a daemon),
    until solved or out of budget."""
    ppo, finished = PPO(env, cfg), Episodes(cfg.window)
    steps, solved, mean_return = 0, False, float("nan")
    start = time.perf_counter()
    obs, _ = env.reset(seed=cfg.seed)
    next_obs = torch.tensor(obs)            # copy: envd's arrays are views of its buffers
    for update in range(1, ppo.num_updates + 1):
        next_obs, pg_loss, v_loss = ppo.update(update, next_obs, finished.add)
        steps += env.num_envs * cfg.num_steps
        mean_return = finished.mean() if finished.recent else mean_return
        solved = len(finished.recent) == cfg.window and mean_return >= cfg.target
        elapsed = time.perf_counter() - start
        if cfg.log_every and (update % cfg.log_every == 0 or solved or update == ppo.num_updates):
            log(f"step {steps:>8}  episodes {finished.count:>5}  mean return (last "
                f"{len(finished.recent)}) {mean_return:7.1f}  pg {pg_loss:+.4f}  "
                f"v {v_loss:.3f}  {steps / elapsed:,.0f} steps/s")
        if solved:
            break

    wall = time.perf_counter() - start
    return Result(solved, steps, wall, mean_return, finished.count, steps / wall,
                  ppo.losses_finite, list(finished.recent))


def make_env(endpoint: str | None, in_process: bool, num_envs: int,
             seed: int) -> tuple[VectorEnv, envd.Client | None]:
    """(env, client): CartPole-v1 from the daemon at endpoint (client None when in-process)."""
    if in_process:
        # Small batches run inline anyway; no worker threads to compete with torch.
        return envd.make("CartPole-v1", num_envs, seed=seed, num_threads=0,
                         autoreset_mode="same_step"), None
    client = envd.connect(endpoint)
    try:
        return client.make("CartPole-v1", num_envs=num_envs, seed=seed,
                           autoreset_mode="same_step"), client
    except BaseException:
        client.close()
        raise


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    d = Config()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--endpoint", default=None,
                   help="the daemon's endpoint (default: ENVD_ENDPOINT, else envd's default ipc socket)")
    p.add_argument("--in-process", action="store_true",
                   help="step the envs in this process (envd.make) instead of a daemon")
    p.add_argument("--num-envs", type=int, default=d.num_envs)
    p.add_argument("--total-steps", type=int, default=d.total_steps,
                   help="budget of env steps (all envs together)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--learning-rate", type=float, default=d.learning_rate)
    p.add_argument("--num-steps", type=int, default=d.num_steps, help="rollout length per env")
    p.add_argument("--target", type=float, default=d.target,
                   help=f"mean return over the last {d.window} episodes that counts as solved")
    p.add_argument("--require-solve", action=argparse.BooleanOptionalAction, default=True,
                   help="exit 1 if the target is not reached within the budget")
    p.add_argument("--torch-threads", type=int, default=1,
                   help="torch intra-op threads (a 64-64 MLP gains nothing from more; "
                        "the envs need the other cores)")
    p.add_argument("--log-every", type=int, default=d.log_every, help="updates between progress lines")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.torch_threads)
    cfg = Config(num_envs=args.num_envs, total_steps=args.total_steps, seed=args.seed,
                 learning_rate=args.learning_rate, num_steps=args.num_steps,
                 target=args.target, log_every=args.log_every)
    env, client = make_env(args.endpoint, args.in_process, cfg.num_envs, cfg.seed)
    where = "in-process" if client is None else f"daemon at {client.endpoint}"
    print(f"PPO CartPole-v1: {cfg.num_envs} envs ({where}), seed {cfg.seed}, "
          f"budget {cfg.total_steps:,} steps", flush=True)
    try:
        result = train(env, cfg, log=lambda line: print(line, flush=True))
    finally:
        env.close()
        if client is not None:
            client.close()
    print(f"RESULT solved={result.solved} seed={cfg.seed} steps={result.steps} "
          f"episodes={result.episodes} mean_return={result.mean_return:.1f} "
          f"wall_s={result.wall_s:.1f} steps_per_s={result.steps_per_s:.0f} "
          f"losses_finite={result.losses_finite}", flush=True)
    if not result.losses_finite:
        return 2
    if args.require_solve and not result.solved:
        print(f"not solved: mean return {result.mean_return:.1f} < {cfg.target} "
              f"within {cfg.total_steps:,} steps", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
