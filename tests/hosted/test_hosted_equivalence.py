"""Hosted Python envs step exactly as gymnasium's own SyncVectorEnv: same
observations, rewards, terminations, truncations, final observations and
episode statistics, for any worker count and autoreset mode, with seeds and
reset masks."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import envd
from conftest import random_actions

MODES = {"next_step": AutoresetMode.NEXT_STEP, "same_step": AutoresetMode.SAME_STEP,
         "disabled": AutoresetMode.DISABLED}
NUM_ENVS = 5
STEPS = 60
LIMIT = 25  # a short time limit: every run ends episodes by truncation too

CASES = ([("CartPole-v1", w, m) for w in (0, 1, 2, 3) for m in MODES]
         + [(e, w, "next_step") for e in ("Acrobot-v1", "Pendulum-v1") for w in (0, 1, 2, 3)]
         + [(e, 2, m) for e in ("Acrobot-v1", "Pendulum-v1") for m in ("same_step", "disabled")])


def assert_same(ours, theirs, what, t):
    assert np.array_equal(ours, np.asarray(theirs, dtype=ours.dtype)), (what, t, ours, theirs)


@pytest.mark.parametrize("env_id,num_workers,mode", CASES)
def test_equal_to_sync_vector_env(env_id, num_workers, mode):
    ref = gym.make_vec(env_id, NUM_ENVS, vectorization_mode="sync", max_episode_steps=LIMIT,
                       vector_kwargs={"autoreset_mode": MODES[mode]})
    env = envd.make("py:" + env_id, NUM_ENVS, seed=7, num_workers=num_workers,
                    autoreset_mode=mode, max_episode_steps=LIMIT, episode_statistics="episode")
    try:
        assert env.num_workers == num_workers and len(env.worker_pids) == num_workers
        assert env.single_observation_space == ref.single_observation_space
        assert env.single_action_space == ref.single_action_space
        obs, _ = env.reset()
        ref_obs, _ = ref.reset(seed=7)
        assert_same(obs, ref_obs, "reset obs", -1)
        rng = np.random.default_rng(1)
        returns, lengths = np.zeros(NUM_ENVS), np.zeros(NUM_ENVS, np.int64)
        ref_done = np.zeros(NUM_ENVS, bool)
        for t in range(STEPS):
            if t == 30:  # a seeded reset of a mask of envs, mid-run
                mask = np.array([True, False, True, False, False])
                seeds = [100 + i for i in range(NUM_ENVS)]
                obs, _ = env.reset(seed=seeds, options={"reset_mask": mask})
                ref_obs, _ = ref.reset(seed=seeds, options={"reset_mask": mask})
                assert_same(obs, ref_obs, "masked reset obs", t)
                returns[mask], lengths[mask], ref_done[mask] = 0, 0, False
            if mode == "disabled" and ref_done.any():  # the caller resets done envs
                obs, _ = env.reset(options={"reset_mask": ref_done.copy()})
                ref_obs, _ = ref.reset(options={"reset_mask": ref_done.copy()})
                assert_same(obs, ref_obs, "disabled-mode reset obs", t)
                returns[ref_done], lengths[ref_done] = 0, 0
            actions = random_actions(env.single_action_space, NUM_ENVS, rng)
            obs, rew, term, trunc, info = env.step(actions)
            ref_obs, ref_rew, ref_term, ref_trunc, ref_info = ref.step(actions)
            for ours, theirs, what in ((obs, ref_obs, "obs"), (rew, ref_rew, "rewards"),
                                       (term, ref_term, "terminations"),
                                       (trunc, ref_trunc, "truncations")):
                assert_same(ours, theirs, what, t)
            done = term | trunc
            if mode == "same_step" and done.any():
                assert_same(info["_final_obs"], ref_info["_final_obs"], "final mask", t)
                for i in np.flatnonzero(done):
                    assert_same(info["final_obs"][i], ref_info["final_obs"][i], "final obs", t)
            # episode statistics: RecordEpisodeStatistics' r and l, summed here
            stepped = ~ref_done if mode == "next_step" else np.ones(NUM_ENVS, bool)
            returns[stepped] += ref_rew[stepped]
            lengths[stepped] += 1
            if done.any():
                assert np.array_equal(info["_episode"], done), t
                assert np.array_equal(info["episode"]["r"][done], returns[done]), t
                assert np.array_equal(info["episode"]["l"][done], lengths[done]), t
                assert (info["episode"]["r"][~done] == 0).all()
            else:
                assert "episode" not in info
            returns[done], lengths[done] = 0, 0
            ref_done = done.copy()
    finally:
        env.close()
        ref.close()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_creator_callable_equals_the_id(num_workers):
    """An env creator (a lambda, sent to the workers with cloudpickle) steps
    like the id it makes."""
    by_id = envd.make("py:CartPole-v1", 4, seed=3, num_workers=num_workers)
    by_creator = envd.make(lambda: gym.make("CartPole-v1"), 4, seed=3, num_workers=num_workers)
    try:
        assert by_creator.max_episode_steps == 500
        assert np.array_equal(by_id.reset()[0], by_creator.reset()[0])
        rng = np.random.default_rng(0)
        for _ in range(40):
            actions = rng.integers(0, 2, 4)
            for ours, theirs in zip(by_creator.step(actions)[:4], by_id.step(actions)[:4]):
                assert np.array_equal(ours, theirs)
    finally:
        by_id.close()
        by_creator.close()


def test_default_worker_count_rule(monkeypatch):
    """num_workers=None: 0 for a cheap step of all envs, one per CPU (at most
    num_envs) for a costly one, 0 on one CPU."""
    from envd.native import hosted_env
    monkeypatch.setattr(hosted_env.os, "sched_getaffinity", lambda pid: {0, 1})
    assert hosted_env.default_num_workers(16, 5e-6) == 0           # CartPole: 80 us
    assert hosted_env.default_num_workers(16, 25e-6) == 2          # Acrobot: 400 us
    assert hosted_env.default_num_workers(1, 1.0) == 0
    monkeypatch.setattr(hosted_env.os, "sched_getaffinity", lambda pid: {0})
    assert hosted_env.default_num_workers(16, 1.0) == 0
    env = envd.make("py:CartPole-v1", 2)  # measured at make; a pick either way works
    try:
        assert env.num_workers in (0, 2)
        env.reset(seed=0)
        env.step(np.zeros(2, np.int64))
    finally:
        env.close()


@pytest.mark.parametrize("num_workers", [0, 1])
def test_module_prefixed_id(num_workers):
    """"py:module:Id" imports the module where the env is made, as gymnasium.make."""
    with envd.make("py:gymnasium.envs.classic_control:CartPole-v1", 2, seed=0,
                   num_workers=num_workers) as env, \
            envd.make("py:CartPole-v1", 2, seed=0, num_workers=num_workers) as plain:
        assert np.array_equal(env.reset()[0], plain.reset()[0])
