"""The rewards and flags an env returns, whatever Python or numpy type they
have, reach the results as numbers: a worker writes a column of its whole
slice at once, a column of one value as one (a number with ndarray.fill,
anything else, e.g. a 0-d array, assigned) (issue 37).  The expected values
come from the env's rule, computed here."""
from __future__ import annotations

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces

import envd

NUM_ENVS = 4
STEPS = 24
TERMINATE_EVERY = 7


def reward_of(kind: str, t: int):
    """The reward of an episode's t-th step, typed as kind says."""
    return {"float": t / 2, "float32": np.float32(t / 2), "int": t,
            "array0": np.array(t / 2)}[kind]


class TypedRewardEnv(gymnasium.Env):
    """Reward reward_of(kind, t) at its episode's step t, terminated (a numpy
    bool) every TERMINATE_EVERY steps, observation [t]."""
    observation_space = spaces.Box(0, 100, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, kind: str):
        self.kind, self.t = kind, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        return (np.full(1, self.t, np.float32), reward_of(self.kind, self.t),
                np.bool_(self.t % TERMINATE_EVERY == 0), False, {})


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kind", ["float", "float32", "int", "array0"])
def test_reward_and_flag_types(kind, num_workers):
    env = envd.make(lambda: TypedRewardEnv(kind), NUM_ENVS, num_workers=num_workers)
    try:
        env.reset(seed=0)
        t, reset_next = 0, False
        actions = np.zeros(NUM_ENVS, np.int64)
        for step in range(STEPS):
            obs, rewards, terms, truncs, _ = env.step(actions)
            if reset_next:  # (NEXT_STEP: the step after a done one resets)
                t, reset_next, reward, term = 0, False, 0.0, False
            else:
                t += 1
                reward, term = float(reward_of(kind, t)), t % TERMINATE_EVERY == 0
                reset_next = term
            where = f"{kind}, step {step}"
            assert rewards.tolist() == [reward] * NUM_ENVS, where
            assert terms.tolist() == [term] * NUM_ENVS, where
            assert truncs.tolist() == [False] * NUM_ENVS, where
            assert obs[:, 0].tolist() == [float(t)] * NUM_ENVS, where
    finally:
        env.close()
