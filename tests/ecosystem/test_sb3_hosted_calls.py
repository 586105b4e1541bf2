"""EnvdVecEnv's get_attr, set_attr and env_method on a hosted py: env reach
its gymnasium envs (in its workers, or the caller's with 0), answered as
SB3's DummyVecEnv over gymnasium's own envs answers them, SB3's indices
included; a subset of indices for env_method is refused clearly."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from stable_baselines3.common.vec_env import DummyVecEnv

from envd.integrations.sb3 import EnvdVecEnv


@pytest.mark.parametrize("num_workers", [0, 2])
def test_hosted_attributes_and_methods_as_dummy_vec_env(num_workers):
    n = 3
    venv = EnvdVecEnv.make("py:CartPole-v1", n, seed=0, num_workers=num_workers)
    ref = DummyVecEnv([lambda: gym.make("CartPole-v1") for _ in range(n)])
    try:
        assert venv.get_attr("gravity") == ref.get_attr("gravity")
        assert venv.get_attr("length", indices=[0, 2]) == ref.get_attr("length", indices=[0, 2])
        assert venv.has_attr("gravity") and not venv.has_attr("no_such_attribute")
        for target in (venv, ref):
            target.set_attr("gravity", 1.5, indices=[1])
        assert venv.get_attr("gravity") == ref.get_attr("gravity") == [9.8, 1.5, 9.8]
        for target in (venv, ref):
            target.set_attr("force_mag", 3.0)
        assert venv.get_attr("force_mag") == ref.get_attr("force_mag") == [3.0] * n
        assert venv.env_method("get_wrapper_attr", "polemass_length") == \
            ref.env_method("get_wrapper_attr", "polemass_length")
        with pytest.raises(NotImplementedError, match="without indices"):
            venv.env_method("get_wrapper_attr", "length", indices=[0])
        # the adapter's own answers stay its own (SB3 asks render_mode at init)
        assert venv.get_attr("render_mode") == [None] * n
        # the envs keep stepping after the calls
        venv.reset()
        obs, *_ = venv.step(np.zeros(n, np.int64))
        assert obs.shape == (n, 4)
    finally:
        venv.close()
        ref.close()
