"""The PPO both PPO examples train with (CleanRL style): ppo_cartpole.py on
CartPole-v1, ppo_simple_spread.py on the rows (every agent of every env) of
simple_spread_v3, with parameter sharing.

A 64-64 tanh actor and critic, rollouts of num_steps x num_envs rows, GAE
(lambda), advantage normalisation per minibatch, the clipped surrogate
objective, a clipped value loss, an entropy bonus, Adam with a linearly
annealed learning rate and gradient clipping.  The env runs in envd's
``same_step`` autoreset mode: the step that ends an episode already returns
the next episode's first observation, so each stored transition belongs to
one episode, and the final observation (``info["final_obs"]``) bootstraps
the value of an episode cut by the time limit (truncated, not terminated).
Episode returns come from envd's own episode statistics
(``info["envd_episode"]["r"]`` under the mask ``info["_envd_episode"]``).

A multi-agent env's agent that is done while its env goes on has a *dead*
row until the env resets (docs/writing-envs.md, "Multi-agent envs"): a zero
observation, reward 0 and its final flags repeated every step.
``info["agent_mask"]`` says which rows are live; only live rows are trained
on, and only a live row whose episode was just cut by the time limit is
bootstrapped (a dead row's repeated truncated flag is no new cut).  Envs
whose agents end together (simple_spread) and single-agent envs have no
dead rows, and train exactly as without the mask.

The examples keep their own loops (when to log, when to stop) around PPO's
three phases: ``rollout``, ``advantages``, ``optimise``.
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from gymnasium.vector import AutoresetMode, VectorEnv
from torch import nn


def layer(in_dim: int, out_dim: int, std: float = math.sqrt(2)) -> nn.Linear:
    """A linear layer with CleanRL's orthogonal init."""
    lin = nn.Linear(in_dim, out_dim)
    nn.init.orthogonal_(lin.weight, std)
    nn.init.constant_(lin.bias, 0.0)
    return lin


class Agent(nn.Module):
    """Separate actor and critic MLPs (64-64, tanh) for a discrete action space."""

    def __init__(self, obs_dim: int, num_actions: int):
        super().__init__()
        self.critic = nn.Sequential(layer(obs_dim, 64), nn.Tanh(), layer(64, 64), nn.Tanh(),
                                    layer(64, 1, std=1.0))
        self.actor = nn.Sequential(layer(obs_dim, 64), nn.Tanh(), layer(64, 64), nn.Tanh(),
                                   layer(64, num_actions, std=0.01))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)

    def act(self, obs: torch.Tensor, action: torch.Tensor | None = None):
        """(action, log-prob, entropy, value); samples an action unless given."""
        dist = torch.distributions.Categorical(logits=self.actor(obs))
        if action is None:
            action = dist.sample()
        return action, dist.log_prob(action), dist.entropy(), self.value(obs)


def episode_returns(info: dict) -> list[float]:
    """The returns of the episodes (per row) that ended in this step."""
    if "envd_episode" not in info:
        return []
    return [float(r) for r in info["envd_episode"]["r"][info["_envd_episode"]]]


class Episodes:
    """The episodes that ended while training: how many, and the returns of
    the last `window` of them (the trained mean return)."""

    def __init__(self, window: int):
        self.recent: deque[float] = deque(maxlen=window)
        self.count = 0

    def add(self, returns: list[float]) -> None:
        self.recent.extend(returns)
        self.count += len(returns)

    def mean(self) -> float:
        """The mean of the last `window` returns (nan before any)."""
        return float(np.mean(self.recent)) if self.recent else float("nan")


class PPO:
    """The agent, its optimiser and the rollout buffers for env (a gymnasium
    VectorEnv from envd made with autoreset_mode="same_step"; its num_envs
    rows are the transition streams).  cfg has the hyper-parameters
    (seed, num_steps, total_steps, learning_rate, gamma, gae_lambda,
    num_minibatches, update_epochs, clip_coef, vf_coef, ent_coef,
    max_grad_norm): each example's Config."""

    def __init__(self, env: VectorEnv, cfg: Any):
        if env.metadata["autoreset_mode"] != AutoresetMode.SAME_STEP:
            raise ValueError("PPO needs an env made with autoreset_mode='same_step'")
        torch.manual_seed(cfg.seed)
        self.env, self.cfg = env, cfg
        n, t_len = env.num_envs, cfg.num_steps
        self.obs_dim = env.single_observation_space.shape[0]
        self.agent = Agent(self.obs_dim, int(env.single_action_space.n))
        self.optimizer = torch.optim.Adam(self.agent.parameters(), lr=cfg.learning_rate,
                                          eps=1e-5)
        self.batch = n * t_len
        self.num_updates = max(1, cfg.total_steps // self.batch)
        self.minibatch = self.batch // cfg.num_minibatches
        self.obs = torch.zeros((t_len, n, self.obs_dim))
        self.actions = torch.zeros((t_len, n), dtype=torch.long)
        self.logprobs = torch.zeros((t_len, n))
        self.rewards = torch.zeros((t_len, n))
        self.dones = torch.zeros((t_len, n))
        self.values = torch.zeros((t_len, n))
        #: 1.0 where the row was live at that step (info["agent_mask"]; all
        #: 1.0 for single-agent envs): dead rows are left out of the loss
        self.live = torch.ones((t_len, n), dtype=torch.bool)
        #: every loss of every minibatch so far was finite
        self.losses_finite = True

    def update(self, update: int, next_obs: torch.Tensor,
               on_episodes: Callable[[list[float]], None]) -> tuple[torch.Tensor, float, float]:
        """Update `update` (1-based) of num_updates: anneal, rollout from
        next_obs, GAE, optimise.  (observation after the rollout, policy
        loss, value loss)."""
        self.anneal(update)
        next_obs = self.rollout(next_obs, on_episodes)
        pg_loss, v_loss = self.optimise(*self.advantages(next_obs))
        return next_obs, pg_loss, v_loss

    def anneal(self, update: int) -> None:
        """The learning rate of update (1-based), annealed linearly to 0."""
        for group in self.optimizer.param_groups:
            group["lr"] = self.cfg.learning_rate * (1.0 - (update - 1) / self.num_updates)

    def rollout(self, next_obs: torch.Tensor,
                on_episodes: Callable[[list[float]], None]) -> torch.Tensor:
        """num_steps steps of every row from next_obs (a copy: envd's arrays
        are views of its buffers); on_episodes(returns) for the episodes that
        end in a step.  Returns the observation after the last step."""
        agent, gamma = self.agent, self.cfg.gamma
        for t in range(self.cfg.num_steps):
            self.obs[t] = next_obs
            with torch.no_grad():
                action, logprob, _, value = agent.act(next_obs)
            self.actions[t], self.logprobs[t], self.values[t] = action, logprob, value
            obs, reward, terminated, truncated, info = self.env.step(action.numpy())
            reward = torch.tensor(reward)
            live = info.get("agent_mask")  # (multi-agent envs: dead rows are False)
            self.live[t] = True if live is None else torch.from_numpy(np.array(live, bool))
            if "final_obs" in info:
                # Bootstrap time-limit cuts: the episode did not end, the
                # clock did, so add gamma * V(final observation).  Live rows
                # only: a dead row repeats its old truncated flag every step.
                cut_rows = truncated & ~terminated
                if live is not None:
                    cut_rows = cut_rows & live
                cut = np.flatnonzero(cut_rows)
                if len(cut):
                    final = torch.tensor(np.stack(info["final_obs"][cut]))
                    with torch.no_grad():
                        reward[cut] += gamma * agent.value(final)
            # (outside: an env that resets itself, such as an Ocean env, has no final_obs)
            on_episodes(episode_returns(info))
            self.rewards[t] = reward
            self.dones[t] = torch.tensor(terminated | truncated, dtype=torch.float32)
            next_obs = torch.tensor(obs)
        return next_obs

    def advantages(self, next_obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """GAE over the rollout (dones[t]: the row's episode ended at step t):
        (advantages, returns)."""
        cfg = self.cfg
        with torch.no_grad():
            next_value = self.agent.value(next_obs)
            advantages = torch.zeros_like(self.rewards)
            last = torch.zeros(self.env.num_envs)
            for t in reversed(range(cfg.num_steps)):
                nv = next_value if t == cfg.num_steps - 1 else self.values[t + 1]
                live = 1.0 - self.dones[t]
                delta = self.rewards[t] + cfg.gamma * nv * live - self.values[t]
                last = delta + cfg.gamma * cfg.gae_lambda * live * last
                advantages[t] = last
        return advantages, advantages + self.values

    def optimise(self, advantages: torch.Tensor, returns: torch.Tensor) -> tuple[float, float]:
        """update_epochs epochs of minibatch updates; the last minibatch's
        (policy loss, value loss)."""
        cfg, batch, agent = self.cfg, self.batch, self.agent
        b_obs, b_actions = self.obs.reshape(batch, self.obs_dim), self.actions.reshape(batch)
        b_logprobs, b_adv = self.logprobs.reshape(batch), advantages.reshape(batch)
        b_returns, b_values = returns.reshape(batch), self.values.reshape(batch)
        b_live = self.live.reshape(batch)
        pg_loss = v_loss = torch.zeros(())  # (no minibatch had live rows to learn from)
        for _ in range(cfg.update_epochs):
            order = torch.randperm(batch)
            for lo in range(0, batch, self.minibatch):
                idx = order[lo:lo + self.minibatch]
                idx = idx[b_live[idx]]  # (dead rows out; unchanged when all are live)
                if len(idx) < 2:  # (too few live rows to normalise advantages over)
                    continue
                _, newlogprob, entropy, newvalue = agent.act(b_obs[idx], b_actions[idx])
                ratio = (newlogprob - b_logprobs[idx]).exp()
                adv = b_adv[idx]
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                pg_loss = torch.max(-adv * ratio,
                                    -adv * ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef)).mean()
                v_clipped = b_values[idx] + (newvalue - b_values[idx]).clamp(-cfg.clip_coef,
                                                                            cfg.clip_coef)
                v_loss = 0.5 * torch.max((newvalue - b_returns[idx]) ** 2,
                                         (v_clipped - b_returns[idx]) ** 2).mean()
                loss = pg_loss + cfg.vf_coef * v_loss - cfg.ent_coef * entropy.mean()
                self.losses_finite &= bool(torch.isfinite(loss))
                self.optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), cfg.max_grad_norm)
                self.optimizer.step()
        return pg_loss.item(), v_loss.item()
