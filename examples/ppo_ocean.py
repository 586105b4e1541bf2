"""PPO on one of PufferLib's Ocean envs through an envd daemon (the algorithm is ppo_core.py).

Build the env from PufferLib's source, start a daemon that serves it, train:

    envd ocean build cartpole
    envd --threads 1 --ocean cartpole --bind ipc:///tmp/envd-ocean/envd.sock &
    python examples/ppo_ocean.py --endpoint ipc:///tmp/envd-ocean/envd.sock

or without a daemon (the same build in this process, the same results):

    python examples/ppo_ocean.py --in-process

PufferLib's own trainer (pufferlib-core's pufferl) needs torch 2.9.0 with its
CUDA extension; this example trains with envd's own PPO (ppo_core.py, as
ppo_cartpole.py) on ``puffer:<env>`` (default ``puffer:cartpole``, PufferLib's
C CartPole: +1 per step, an episode ends when the pole falls or after 200
steps).  Ocean envs reset themselves inside their step and set no truncation
flag, so a 200-step cap is not bootstrapped; episode returns come from envd's
``info["envd_episode"]``, fed by the env's own Log.

The last line (RESULT) gives the mean return of the first `window` episodes
(a random policy's, nearly), the mean of the last `window`, whether the target
was reached and the wall time; the exit status is 1 when the target was not
reached within ``--total-steps``, unless ``--no-require-solve``.

Measured on the 2-core development box (shared with other work), torch 2.13.0
CPU with one torch thread, against ``envd --threads 1 --ocean cartpole`` over
ipc, defaults (8 envs, target 150, budget 150,000 steps), seed 1 reached a
mean return of 159.6 (first 20 episodes: 18.1) in 7,680 steps and 4.3 s:

    python examples/ppo_ocean.py --endpoint ipc:///tmp/envd-ocean/envd.sock --seed 1

(seeds 2-5: examples/README.md; docs/ocean.md.)
"""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from gymnasium.vector import VectorEnv
from ppo_cartpole import Config as CartPoleConfig
from ppo_core import PPO, Episodes

import envd


@dataclass
class Config(CartPoleConfig):
    """PPO's hyper-parameters: ppo_cartpole.py's, which learn Ocean's CartPole
    too; the target is Ocean CartPole's (its episodes end at 200 steps)."""
    target: float = 150.0         # mean return of the last `window` episodes


def train(env: VectorEnv, cfg: Config, log: Callable[[str], None] = print) -> dict:
    """Train PPO until the target or the budget; what the run measured."""
    ppo, finished = PPO(env, cfg), Episodes(cfg.window)
    first: list[float] = []

    def on_episodes(returns: list[float]) -> None:
        first.extend(returns[:cfg.window - len(first)])
        finished.add(returns)

    steps, solved, mean_return = 0, False, float("nan")
    start = time.perf_counter()
    obs, _ = env.reset(seed=cfg.seed)
    next_obs = torch.tensor(obs)            # copy: envd's arrays are views of its buffers
    for update in range(1, ppo.num_updates + 1):
        next_obs, pg_loss, v_loss = ppo.update(update, next_obs, on_episodes)
        steps += env.num_envs * cfg.num_steps
        mean_return = finished.mean() if finished.recent else mean_return
        solved = len(finished.recent) == cfg.window and mean_return >= cfg.target
        elapsed = time.perf_counter() - start
        if cfg.log_every and (update % cfg.log_every == 0 or solved or update == ppo.num_updates):
            log(f"step {steps:>8}  episodes {finished.count:>5}  mean return (last "
                f"{len(finished.recent)}) {mean_return:7.1f}  pg {pg_loss:+.4f}  "
                f"v {v_loss:.3f}  {steps / elapsed:,.0f} steps/s  {elapsed:6.1f} s")
        if solved:
            break
    wall = time.perf_counter() - start
    return {"solved": solved, "steps": steps, "episodes": finished.count,
            "first_mean": sum(first) / len(first) if first else float("nan"),
            "mean_return": mean_return, "wall_s": wall, "losses_finite": ppo.losses_finite}


def make_env(env_id: str, endpoint: str | None, in_process: bool, num_envs: int,
             seed: int) -> tuple[VectorEnv, envd.Client | None]:
    """(env, client): env_id made in this process or by the daemon at endpoint."""
    if in_process:
        return envd.make(env_id, num_envs, seed=seed, num_threads=0), None
    client = envd.connect(endpoint)
    try:
        return client.make(env_id, num_envs=num_envs, seed=seed), client
    except BaseException:
        client.close()
        raise


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    d = Config()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--env", default="cartpole", help="the Ocean env (puffer:<env>)")
    p.add_argument("--endpoint", default=None,
                   help="the daemon's endpoint (default: ENVD_ENDPOINT, else envd's default ipc socket)")
    p.add_argument("--in-process", action="store_true",
                   help="step the envs in this process (envd.make) instead of a daemon")
    p.add_argument("--num-envs", type=int, default=d.num_envs)
    p.add_argument("--total-steps", type=int, default=d.total_steps,
                   help="budget of env steps (all envs together)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--target", type=float, default=d.target,
                   help=f"mean return over the last {d.window} episodes that counts as solved")
    p.add_argument("--require-solve", action=argparse.BooleanOptionalAction, default=True,
                   help="exit 1 if the target is not reached within the budget")
    p.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--log-every", type=int, default=d.log_every, help="updates between progress lines")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.torch_threads)
    cfg = Config(num_envs=args.num_envs, total_steps=args.total_steps, seed=args.seed,
                 target=args.target, log_every=args.log_every)
    env_id = f"puffer:{args.env}"
    env, client = make_env(env_id, args.endpoint, args.in_process, cfg.num_envs, cfg.seed)
    where = "in-process" if client is None else f"daemon at {client.endpoint}"
    print(f"PPO {env_id}: {env.num_envs} rows ({where}), seed {cfg.seed}, "
          f"budget {cfg.total_steps:,} steps", flush=True)
    try:
        result = train(env, cfg, log=lambda line: print(line, flush=True))
    finally:
        env.close()
        if client is not None:
            client.close()
    print(f"RESULT env={env_id} solved={result['solved']} seed={cfg.seed} "
          f"steps={result['steps']} episodes={result['episodes']} "
          f"first_mean={result['first_mean']:.1f} mean_return={result['mean_return']:.1f} "
          f"wall_s={result['wall_s']:.1f} losses_finite={result['losses_finite']}", flush=True)
    if not result["losses_finite"]:
        return 2
    if args.require_solve and not result["solved"]:
        print(f"not solved: mean return {result['mean_return']:.1f} < {cfg.target} "
              f"within {cfg.total_steps:,} steps", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
