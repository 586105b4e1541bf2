"""envd.make against gymnasium.make_vec(..., vectorization_mode="sync"): the
independent reference.  Same seed, same actions: observations bit-equal,
rewards equal as float32, terminations/truncations and episode statistics
(gymnasium's RecordEpisodeStatistics) equal, across autoresets."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.wrappers.vector import RecordEpisodeStatistics
from support.builtin_envs import GYMNASIUM_ENV_IDS, random_actions

import envd

STEPS = 2000


def assert_same_step(step, ours, ref):
    o1, r1, te1, tr1, i1 = ours
    o2, r2, te2, tr2, i2 = ref
    assert o1.dtype == o2.dtype and o1.shape == o2.shape
    assert o1.tobytes() == o2.tobytes(), f"observations differ at step {step}:\n{o1}\n{o2}"
    np.testing.assert_array_equal(r1, r2.astype(np.float32), err_msg=f"rewards, step {step}")
    np.testing.assert_array_equal(te1, te2, err_msg=f"terminations, step {step}")
    np.testing.assert_array_equal(tr1, tr2, err_msg=f"truncations, step {step}")
    # envd's statistics (info["envd_episode"] by default) against gymnasium's wrapper's
    assert ("envd_episode" in i1) == ("episode" in i2), f"episode info presence, step {step}"
    if "episode" in i2:
        np.testing.assert_array_equal(i1["_envd_episode"], i2["_episode"])
        np.testing.assert_array_equal(i1["envd_episode"]["l"], i2["episode"]["l"])
        np.testing.assert_array_equal(i1["envd_episode"]["r"], i2["episode"]["r"])


@pytest.mark.parametrize("num_envs", [1, 7, 64])
@pytest.mark.parametrize("seed", [0, 1, 123])
@pytest.mark.parametrize("env_id", GYMNASIUM_ENV_IDS)
def test_matches_gymnasium_sync_vector_env(env_id, seed, num_envs):
    ref = RecordEpisodeStatistics(gym.make_vec(env_id, num_envs=num_envs,
                                               vectorization_mode="sync"))
    with envd.make(env_id, num_envs, seed=seed, num_threads=0) as env:
        obs, _ = env.reset()
        ref_obs, _ = ref.reset(seed=seed)
        assert obs.tobytes() == ref_obs.tobytes()
        rng = np.random.default_rng(seed + 1000)
        episodes = 0
        for step in range(STEPS):
            actions = random_actions(env.single_action_space, num_envs, rng)
            ours = env.step(actions)
            expected = ref.step(actions)
            assert_same_step(step, ours, expected)
            episodes += int(np.sum(ours[2] | ours[3]))
        assert episodes > 0, "the run must cross autoresets"
    ref.close()


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Acrobot-v1", "Pendulum-v1"])
def test_same_step_autoreset_matches_gymnasium(env_id):
    num_envs, seed = 7, 5
    ref = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync",
                       vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
    with envd.make(env_id, num_envs, seed=seed, autoreset_mode="same_step") as env:
        assert env.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
        assert env.reset()[0].tobytes() == ref.reset(seed=seed)[0].tobytes()
        rng = np.random.default_rng(7)
        finals = 0
        for step in range(1200):
            actions = random_actions(env.single_action_space, num_envs, rng)
            o1, r1, te1, tr1, i1 = env.step(actions)
            o2, r2, te2, tr2, i2 = ref.step(actions)
            assert o1.tobytes() == o2.tobytes(), step
            np.testing.assert_array_equal(r1, r2.astype(np.float32))
            np.testing.assert_array_equal(te1 | tr1, te2 | tr2)
            assert ("final_obs" in i1) == ("final_obs" in i2)
            if "final_obs" in i2:
                np.testing.assert_array_equal(i1["_final_obs"], i2["_final_obs"])
                for a, b in zip(i1["final_obs"], i2["final_obs"]):
                    assert (a is None and b is None) or a.tobytes() == b.tobytes()
                finals += 1
        assert finals > 0
    ref.close()


def test_disabled_autoreset_matches_gymnasium_with_reset_mask():
    num_envs, seed, env_id = 7, 3, "CartPole-v1"
    ref = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync",
                       vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.DISABLED})
    with envd.make(env_id, num_envs, seed=seed, autoreset_mode="disabled") as env:
        assert env.reset()[0].tobytes() == ref.reset(seed=seed)[0].tobytes()
        rng = np.random.default_rng(11)
        resets = 0
        for step in range(600):
            actions = random_actions(env.single_action_space, num_envs, rng)
            o1, r1, te1, tr1, _ = env.step(actions)
            o2, r2, te2, tr2, _ = ref.step(actions)
            assert o1.tobytes() == o2.tobytes(), step
            np.testing.assert_array_equal(te1, te2)
            done = te1 | tr1
            if done.any():
                resets += 1
                assert (env.reset(options={"reset_mask": done.copy()})[0].tobytes()
                        == ref.reset(options={"reset_mask": done.copy()})[0].tobytes())
        assert resets > 0
    ref.close()


def test_explicit_seed_list_and_reseeding_match_gymnasium():
    seeds = [42, 7, 7, 2**40 + 3]
    ref = gym.make_vec("Pendulum-v1", num_envs=4, vectorization_mode="sync")
    with envd.make("Pendulum-v1", 4) as env:
        assert env.reset(seed=seeds)[0].tobytes() == ref.reset(seed=seeds)[0].tobytes()
        assert env.reset(seed=9)[0].tobytes() == ref.reset(seed=9)[0].tobytes()
        # reset without a seed continues each env's generator, as gymnasium does
        assert env.reset()[0].tobytes() == ref.reset()[0].tobytes()
    ref.close()


@pytest.mark.parametrize("env_id,kwargs,gym_kwargs", [
    ("Pendulum-v1", {"g": 9.81}, {"g": 9.81}),
    ("MountainCar-v0", {"goal_velocity": 0.01}, {"goal_velocity": 0.01}),
    ("CartPole-v1", {"sutton_barto_reward": True}, {"sutton_barto_reward": True}),
])
def test_env_kwargs_and_time_limit_match_gymnasium(env_id, kwargs, gym_kwargs):
    num_envs, seed, limit = 5, 2, 50
    ref = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync",
                       max_episode_steps=limit, **gym_kwargs)
    with envd.make(env_id, num_envs, seed=seed, max_episode_steps=limit, **kwargs) as env:
        assert env.reset()[0].tobytes() == ref.reset(seed=seed)[0].tobytes()
        rng = np.random.default_rng(0)
        truncations = 0
        for step in range(300):
            actions = random_actions(env.single_action_space, num_envs, rng)
            ours, theirs = env.step(actions), ref.step(actions)
            assert ours[0].tobytes() == theirs[0].tobytes(), step
            np.testing.assert_array_equal(ours[1], theirs[1].astype(np.float32))
            np.testing.assert_array_equal(ours[3], theirs[3])
            truncations += int(ours[3].sum())
        assert truncations > 0
    ref.close()


@pytest.mark.parametrize("env_id", GYMNASIUM_ENV_IDS)
def test_spaces_and_time_limits_match_gymnasium(env_id):
    ref = gym.make(env_id)
    spec = envd.native.get_spec(env_id)
    assert spec.max_episode_steps == gym.spec(env_id).max_episode_steps
    assert spec.observation_space == ref.observation_space
    assert spec.action_space == ref.action_space
    with envd.make(env_id, 3) as env:
        assert env.observation_space == gym.vector.utils.batch_space(ref.observation_space, 3)
        assert env.action_space == gym.vector.utils.batch_space(ref.action_space, 3)
    ref.close()
