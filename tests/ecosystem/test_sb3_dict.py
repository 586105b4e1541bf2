"""Stable-Baselines3 on a Dict observation through envd.integrations.sb3: a
hosted Python env (sb3_dict_env.py) is step for step SB3's DummyVecEnv over
the same gymnasium env, and SB3's PPO with MultiInputPolicy learns it through
a daemon; evaluate_policy reads the adapter's Monitor-shaped episodes without
warning that no Monitor wraps the env."""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import sb3_dict_env
from stable_baselines3 import PPO
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv

from envd.integrations.sb3 import EnvdVecEnv

HOSTED_ID = f"py:sb3_dict_env:{sb3_dict_env.ENV_ID}"
NUM_ENVS = 4


def test_dict_observations_match_dummy_vec_env():
    ours = EnvdVecEnv.make(HOSTED_ID, NUM_ENVS, num_workers=2)
    ref = DummyVecEnv([lambda: gym.make(sb3_dict_env.ENV_ID) for _ in range(NUM_ENVS)])
    assert ours.observation_space == ref.observation_space
    assert ours.seed(11) == ref.seed(11)
    rng = np.random.default_rng(0)
    got, want = ours.reset(), ref.reset()
    ended = 0
    for t in range(3 * sb3_dict_env.EPISODE_STEPS):
        assert got.keys() == want.keys() == {"cue", "noise"}
        for key in want:
            assert got[key].dtype == want[key].dtype and got[key].shape == want[key].shape
            assert got[key].tobytes() == want[key].tobytes(), (t, key)
        actions = rng.integers(0, 3, NUM_ENVS)
        (got, rewards, dones, infos), (want, ref_rewards, ref_dones, ref_infos) = \
            ours.step(actions), ref.step(actions)
        assert np.array_equal(rewards, ref_rewards) and np.array_equal(dones, ref_dones)
        for i in np.flatnonzero(dones):
            mine, theirs = infos[i]["terminal_observation"], ref_infos[i]["terminal_observation"]
            assert mine.keys() == theirs.keys()
            assert all(np.array_equal(mine[k], theirs[k]) for k in theirs)
            assert infos[i]["TimeLimit.truncated"] is ref_infos[i]["TimeLimit.truncated"] is True
            assert infos[i]["episode"]["l"] == sb3_dict_env.EPISODE_STEPS
            ended += 1
    assert ended == 3 * NUM_ENVS
    ours.close()
    ref.close()


def test_nested_observations_are_refused_at_make():
    with pytest.raises(ValueError, match="flat Dict observation: entry 'cue' is a Tuple"):
        EnvdVecEnv.make(sb3_dict_env.NestedCueEnv, 2, num_workers=0)


def test_composite_actions_are_refused_at_make():
    with pytest.raises(ValueError, match="SB3 cannot take a Tuple action"):
        EnvdVecEnv.make(sb3_dict_env.TupleActionEnv, 2, num_workers=0)


def test_monitor_is_answered_truthfully():
    """The adapter writes Monitor's info["episode"]: env_is_wrapped(Monitor)
    says so while episode statistics are on, and no other wrapper is claimed."""
    venv = EnvdVecEnv.make(HOSTED_ID, 2, num_workers=0)
    assert venv.env_is_wrapped(Monitor) == [True, True]
    assert venv.env_is_wrapped(gym.wrappers.TimeLimit) == [False, False]
    venv.close()
    venv = EnvdVecEnv.make(HOSTED_ID, 2, num_workers=0, episode_statistics=False)
    assert venv.env_is_wrapped(Monitor) == [False, False]
    venv.close()


def test_ppo_multi_input_policy_learns_a_dict_env_through_a_daemon(harness):
    folder = Path(sb3_dict_env.__file__).parent
    path = os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))
    daemon = harness.daemon("--threads", "1", "--import", "sb3_dict_env",
                            "--python-env", sb3_dict_env.ENV_ID, env={"PYTHONPATH": path})
    client = harness.connect(daemon)
    venv = EnvdVecEnv.make(f"py:{sb3_dict_env.ENV_ID}", NUM_ENVS, client=client, seed=0,
                           num_workers=1)
    model = PPO("MultiInputPolicy", venv, n_steps=64, batch_size=64, n_epochs=4,
                learning_rate=3e-3, seed=0, device="cpu", verbose=0)
    model.learn(total_timesteps=NUM_ENVS * 64 * 3)
    assert model.num_timesteps == NUM_ENVS * 64 * 3
    episodes = list(model.ep_info_buffer)
    assert episodes and all(ep["l"] == sb3_dict_env.EPISODE_STEPS for ep in episodes)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mean, _ = evaluate_policy(model, venv, n_eval_episodes=NUM_ENVS * 4)
    assert not [w for w in caught if "Monitor" in str(w.message)]
    # a random policy earns 1/3 a step (8/3 an episode); reading the cue, 8
    assert mean > 0.6 * sb3_dict_env.EPISODE_STEPS, mean
    venv.close()
