"""One hosted env as a gymnasium.Env (envd.single_env.EnvdEnv, what
gymnasium.make("envd/py:...") returns) whose spaces are composite: Dict
observations and Tuple actions go through leaf by leaf, and its infos
(strings, nested dicts, arrays) come back as the env gave them.  The
reference is the env itself, made by gymnasium and stepped with the same
seed and actions."""
from __future__ import annotations

import daemon_envs  # noqa: F401  (registers the envd-test/ ids)
import gymnasium
import numpy as np
import pytest

from envd import leaves
from envd.errors import InvalidActionError
from envd.single_env import EnvdEnv

DICT_OBS = "py:daemon_envs:envd-test/DictObs-v0"


def assert_same_value(space, got, want):
    for (path, _), a, b in zip(leaves.leaves(space), leaves.flatten(space, got),
                               leaves.flatten(space, want)):
        assert np.asarray(a).dtype == np.asarray(b).dtype, path
        np.testing.assert_array_equal(a, b, err_msg=str(path))


def assert_same_info(got, want):
    """want's keys with equal values (envd adds its episode statistics)."""
    assert set(want) <= set(got), (got, want)
    for key, value in want.items():
        if isinstance(value, dict):
            assert_same_info(got[key], value)
        else:
            np.testing.assert_array_equal(got[key], value, err_msg=key)


@pytest.mark.parametrize("seed", [0, 3, 11])
def test_a_composite_env_steps_as_the_env_itself(seed):
    ref = gymnasium.make("envd-test/DictObs-v0")
    rng = np.random.default_rng(seed)
    ended = 0
    with EnvdEnv.make(DICT_OBS) as env:
        assert env.observation_space == ref.observation_space
        assert env.action_space == ref.action_space
        obs, info = env.reset(seed=seed)
        want_obs, want_info = ref.reset(seed=seed)
        for episode_seed in range(seed, seed + 400):
            assert_same_value(env.observation_space, obs, want_obs)
            assert_same_info(info, want_info)
            # every button pressed now and then: the env's nested info ("combo")
            action = (np.int64(rng.integers(-1, 2)), rng.integers(0, 2, 2).astype(np.int8),
                      rng.uniform(-1, 1, 2).astype(np.float32))
            obs, reward, terminated, truncated, info = env.step(action)
            want_obs, want_reward, want_terminated, want_truncated, want_info = ref.step(action)
            assert (reward, terminated, truncated) == (want_reward, want_terminated,
                                                       want_truncated)
            assert type(reward) is float and type(terminated) is bool
            if terminated or truncated:
                assert_same_value(env.observation_space, obs, want_obs)
                assert_same_info(info, want_info)
                assert info["envd_episode"]["l"] == ref.unwrapped.t
                ended += 1
                obs, info = env.reset(seed=episode_seed)
                want_obs, want_info = ref.reset(seed=episode_seed)
    ref.close()
    assert ended >= 5  # (terminated at random, truncated at 20 steps)


def test_a_composite_action_of_the_wrong_structure_is_refused_and_the_env_goes_on():
    with EnvdEnv.make(DICT_OBS) as env:
        env.reset(seed=1)
        with pytest.raises(InvalidActionError, match="must be a tuple of 3 items"):
            env.step((np.int64(0), np.zeros(2, np.int8)))
        with pytest.raises(InvalidActionError, match="shape"):
            env.step((np.int64(0), np.zeros(3, np.int8), np.zeros(2, np.float32)))
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        assert env.observation_space.contains(obs)
