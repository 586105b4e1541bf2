"""A small env with a Dict observation, for SB3's MultiInputPolicy through
envd's hosted Python envs (tests/ecosystem/test_sb3_dict.py): the daemon
imports this module (--import sb3_dict_env) to register its id.

Each step shows a cue (Discrete(3)) beside noise (a Box); the action that
names the cue pays 1.  A random policy earns 1/3 a step; one that reads the
cue earns 1, so a policy that learned anything from the Dict shows it."""
from __future__ import annotations

import gymnasium
import numpy as np
from gymnasium import spaces

ENV_ID = "envd-test/Cue-v0"
EPISODE_STEPS = 8


class CueEnv(gymnasium.Env):
    observation_space = spaces.Dict({"noise": spaces.Box(-1, 1, (2,), np.float32),
                                     "cue": spaces.Discrete(3)})
    action_space = spaces.Discrete(3)

    def _obs(self) -> dict:
        self.cue = int(self.np_random.integers(3))
        return {"noise": self.np_random.uniform(-1, 1, 2).astype(np.float32), "cue": self.cue}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        reward = float(int(action) == self.cue)
        self.t += 1
        return self._obs(), reward, False, False, {}


if ENV_ID not in gymnasium.registry:
    gymnasium.register(ENV_ID, entry_point=f"{__name__}:CueEnv",
                       max_episode_steps=EPISODE_STEPS)


class NestedCueEnv(CueEnv):
    """CueEnv with a Tuple inside its Dict, which SB3 cannot take."""
    observation_space = spaces.Dict({"noise": spaces.Box(-1, 1, (2,), np.float32),
                                     "cue": spaces.Tuple((spaces.Discrete(3),))})

    def _obs(self) -> dict:
        obs = super()._obs()
        return {"noise": obs["noise"], "cue": (obs["cue"],)}


class TupleActionEnv(CueEnv):
    """CueEnv whose action is a Tuple (the cue, and a Box), which SB3 cannot take."""
    action_space = spaces.Tuple((spaces.Discrete(3), spaces.Box(-1, 1, (1,), np.float32)))

    def step(self, action):
        return super().step(action[0])
