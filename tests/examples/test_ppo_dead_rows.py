"""examples/ppo_core.py on a tiny rollout with a dead row (review finding:
PPO bootstrapped and trained on rows whose agent had died).  A fake
same_step VectorEnv of 2 rows: row 0 is live every step, row 1's agent was
cut by the time limit before the rollout, so its row is dead (agent_mask
False) and repeats truncated=True with a final observation every step, as
envd's multi-agent envs present a dead row."""
from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from ppo_core import PPO  # noqa: E402

OBS_DIM, STEPS = 4, 8


class DeadRowEnv(VectorEnv):
    """Row 0 live, row 1 dead: dead_obs, dead_reward and a final observation
    of ones (V(ones) != 0, so a bootstrap would show) every step."""

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}  # noqa: RUF012 -- gymnasium's, read only

    def __init__(self, dead_obs: float, dead_reward: float):
        self.num_envs = 2
        self.single_observation_space = spaces.Box(-10, 10, (OBS_DIM,), np.float32)
        self.single_action_space = spaces.Discrete(2)
        self.dead_obs, self.dead_reward, self.t = dead_obs, dead_reward, 0

    def _obs(self) -> np.ndarray:
        live = np.full(OBS_DIM, 0.1 * (self.t % 3), np.float32)
        return np.stack([live, np.full(OBS_DIM, self.dead_obs, np.float32)])

    def reset(self, *, seed=None, options=None):
        return self._obs(), {"agent_mask": np.array([True, False])}

    def step(self, actions):
        self.t += 1
        final = np.empty(2, object)
        final[1] = np.ones(OBS_DIM, np.float32)
        info = {"agent_mask": np.array([True, False]), "final_obs": final,
                "_final_obs": np.array([False, True])}
        return (self._obs(), np.array([1.0, self.dead_reward], np.float32),
                np.array([False, False]), np.array([False, True]), info)


def config() -> SimpleNamespace:
    return SimpleNamespace(seed=0, num_steps=STEPS, total_steps=2 * STEPS, learning_rate=1e-2,
                           gamma=0.9, gae_lambda=0.95, num_minibatches=2, update_epochs=2,
                           clip_coef=0.2, vf_coef=0.5, ent_coef=0.01, max_grad_norm=0.5)


def trained(dead_obs: float, dead_reward: float) -> tuple[PPO, list[torch.Tensor]]:
    env = DeadRowEnv(dead_obs, dead_reward)
    ppo = PPO(env, config())
    obs, _ = env.reset()
    ppo.update(1, torch.tensor(obs), lambda returns: None)
    return ppo, [p.detach().clone() for p in ppo.agent.parameters()]


def test_dead_row_is_not_bootstrapped():
    """A dead row's repeated truncated flag is no time-limit cut: its reward
    stays the env's (0), never reward + gamma * V(final observation)."""
    ppo, _ = trained(0.0, 0.0)
    assert ppo.rewards[:, 1].tolist() == [0.0] * STEPS
    assert ppo.rewards[:, 0].tolist() == [1.0] * STEPS
    assert not ppo.live[:, 1].any() and ppo.live[:, 0].all()


def test_dead_rows_do_not_train():
    """Whatever a dead row holds (its observation, its reward), the update
    is the same: only live rows enter the loss."""
    _, params = trained(0.0, 0.0)
    _, other = trained(5.0, 100.0)
    for a, b in zip(params, other):
        assert torch.equal(a, b)
