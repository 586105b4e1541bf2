"""PPO with parameter sharing on simple_spread_v3 (3 agents) through an envd daemon.

Start a daemon, then train through it:

    envd --threads 1 --bind ipc:///tmp/envd-ppo/envd.sock &
    python examples/ppo_simple_spread.py --endpoint ipc:///tmp/envd-ppo/envd.sock

or without a daemon (the same native envs in this process, same results):

    python examples/ppo_simple_spread.py --in-process

Multi-agent envs are agents as rows: ``make("simple_spread_v3", n)`` is n envs
of 3 agents, a VectorEnv of 3n rows (row 3i + a is agent a of env i), each row
with its own observation, reward and episode statistics.  Parameter sharing
is then nothing more than single-agent PPO over the rows (ppo_core.py, shared
with ppo_cartpole.py): one actor and one critic act for every agent of every
env, and every row is one transition stream.  All agents of an env end together here
(max_cycles=25 truncates them), so no row is ever dead.

What it prints: the mean episode return per agent of a uniformly random
policy (``--random-episodes`` episodes of every row, measured first on the
same envs), the trained policy's mean over the last ``--window`` finished
agent-episodes, and the improvement.  The exit status is 1 when the
improvement is below ``--margin`` (unless ``--no-require-improvement``, for
short runs and smoke tests), 2 when a loss was not finite.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from gymnasium.vector import VectorEnv
from ppo_core import PPO, Episodes, episode_returns

import envd

ENV_ID = "simple_spread_v3"


@dataclass
class Config:
    """PPO's hyper-parameters for simple_spread_v3 (parameter sharing)."""
    num_envs: int = 16            # envs; 3 agent rows each
    total_steps: int = 2_000_000  # agent steps (rows x steps): the budget
    seed: int = 1
    num_steps: int = 50           # steps per env per rollout (two 25-step episodes)
    learning_rate: float = 3e-4   # annealed linearly to 0
    gamma: float = 0.95           # (25-step episodes: a short horizon learns faster here)
    gae_lambda: float = 0.95
    num_minibatches: int = 4
    update_epochs: int = 4
    clip_coef: float = 0.2
    vf_coef: float = 0.5
    ent_coef: float = 0.01
    max_grad_norm: float = 0.5
    window: int = 480             # agent-episodes in the trained mean (ten rollouts' worth)
    log_every: int = 10


@dataclass
class Result:
    """What a training run measured."""
    random_return: float          # mean episode return per agent, uniformly random actions
    trained_return: float         # mean of the last `window` agent-episodes while training
    agent_steps: int              # rows x steps taken while training
    episodes: int                 # agent-episodes finished while training
    wall_s: float
    losses_finite: bool


def random_return(env: VectorEnv, episodes: int, seed: int) -> float:
    """Mean agent-episode return of uniformly random actions over `episodes`
    episodes of every row (the baseline the trained policy is compared with)."""
    rng = np.random.default_rng(seed)
    env.reset(seed=seed + 10_000)
    n_actions = int(env.single_action_space.n)
    done: list[float] = []
    while len(done) < episodes * env.num_envs:
        _, _, _, _, info = env.step(rng.integers(0, n_actions, env.num_envs))
        done += episode_returns(info)
    return float(np.mean(done))


def train(env: VectorEnv, cfg: Config, log: Callable[[str], None] = print
          ) -> tuple[float, int, int, float, bool]:
    """PPO (ppo_core.py) over the rows of env (made with
    autoreset_mode="same_step"): (trained mean return, agent steps,
    agent-episodes, wall seconds, losses finite)."""
    ppo, finished = PPO(env, cfg), Episodes(cfg.window)  # rows: every agent of every env
    steps, start = 0, time.perf_counter()
    obs, _ = env.reset(seed=cfg.seed)
    next_obs = torch.tensor(obs)  # copy: envd's arrays are views of its buffers
    for update in range(1, ppo.num_updates + 1):
        # (every episode is cut by max_cycles: ppo_core bootstraps V(final observation))
        next_obs, pg_loss, v_loss = ppo.update(update, next_obs, finished.add)
        steps += env.num_envs * cfg.num_steps
        if cfg.log_every and (update % cfg.log_every == 0 or update == ppo.num_updates):
            elapsed = time.perf_counter() - start
            log(f"agent steps {steps:>8}  agent-episodes {finished.count:>6}  mean return "
                f"(last {len(finished.recent)}) {finished.mean():8.2f}  pg {pg_loss:+.4f}  "
                f"v {v_loss:.3f}  {steps / elapsed:,.0f} agent steps/s")
    return (finished.mean(), steps, finished.count, time.perf_counter() - start,
            ppo.losses_finite)


def make_env(endpoint: str | None, in_process: bool, num_envs: int,
             seed: int) -> tuple[VectorEnv, envd.Client | None]:
    """(env, client): simple_spread_v3 from the daemon at endpoint (client None in-process)."""
    if in_process:
        return envd.make(ENV_ID, num_envs, seed=seed, num_threads=0,
                         autoreset_mode="same_step"), None
    client = envd.connect(endpoint)
    try:
        return client.make(ENV_ID, num_envs, seed=seed, autoreset_mode="same_step"), client
    except BaseException:
        client.close()
        raise


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    d = Config()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--endpoint", default=None,
                   help="the daemon's endpoint (default: ENVD_ENDPOINT, else envd's default "
                        "ipc socket)")
    p.add_argument("--in-process", action="store_true",
                   help="step the envs in this process (envd.make) instead of a daemon")
    p.add_argument("--num-envs", type=int, default=d.num_envs, help="envs (3 agents each)")
    p.add_argument("--total-steps", type=int, default=d.total_steps,
                   help="budget of agent steps (rows x steps)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--num-steps", type=int, default=d.num_steps, help="rollout length per env")
    p.add_argument("--learning-rate", type=float, default=d.learning_rate)
    p.add_argument("--gamma", type=float, default=d.gamma)
    p.add_argument("--ent-coef", type=float, default=d.ent_coef)
    p.add_argument("--window", type=int, default=d.window,
                   help="agent-episodes in the trained mean return")
    p.add_argument("--random-episodes", type=int, default=10,
                   help="episodes of every row the random baseline averages")
    p.add_argument("--margin", type=float, default=5.0,
                   help="the least improvement of the mean return over random that counts")
    p.add_argument("--require-improvement", action=argparse.BooleanOptionalAction, default=True,
                   help="exit 1 if the trained return is not --margin above random")
    p.add_argument("--torch-threads", type=int, default=1)
    p.add_argument("--log-every", type=int, default=d.log_every)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.torch_threads)
    cfg = Config(num_envs=args.num_envs, total_steps=args.total_steps, seed=args.seed,
                 num_steps=args.num_steps, window=args.window, log_every=args.log_every,
                 learning_rate=args.learning_rate, gamma=args.gamma, ent_coef=args.ent_coef)
    env, client = make_env(args.endpoint, args.in_process, cfg.num_envs, cfg.seed)
    where = "in-process" if client is None else f"daemon at {client.endpoint}"
    print(f"PPO (parameter sharing) {ENV_ID}: {cfg.num_envs} envs x {env.num_agents} agents "
          f"({where}), seed {cfg.seed}, budget {cfg.total_steps:,} agent steps", flush=True)
    try:
        baseline = random_return(env, args.random_episodes, cfg.seed)
        print(f"random policy: mean agent-episode return {baseline:.2f}", flush=True)
        trained, steps, episodes, wall, finite = train(env, cfg,
                                                       log=lambda s: print(s, flush=True))
    finally:
        env.close()
        if client is not None:
            client.close()
    result = Result(baseline, trained, steps, episodes, wall, finite)
    print(f"RESULT random_return={result.random_return:.2f} "
          f"trained_return={result.trained_return:.2f} "
          f"improvement={result.trained_return - result.random_return:.2f} "
          f"agent_steps={result.agent_steps} episodes={result.episodes} "
          f"wall_s={result.wall_s:.1f} losses_finite={result.losses_finite}", flush=True)
    if not result.losses_finite:
        return 2
    if args.require_improvement and not (result.trained_return - result.random_return
                                         >= args.margin):
        print(f"not improved by {args.margin}: random {result.random_return:.2f}, trained "
              f"{result.trained_return:.2f}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
