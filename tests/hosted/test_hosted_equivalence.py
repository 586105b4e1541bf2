"""Hosted Python envs step exactly as gymnasium's own SyncVectorEnv: same
observations (any space: Dict and Tuple observations come back as gymnasium
batches them), rewards (float64, as SyncVectorEnv's: compared without a
cast), terminations, truncations and infos (merged as gymnasium merges them,
final_obs and final_info included), for any worker count and autoreset
mode, with seeds and reset masks; and envd's episode statistics."""
from __future__ import annotations

import daemon_envs  # noqa: F401  (registers the envd-test/ ids in this process)
import gymnasium as gym
import numpy as np
import pytest
from equivalence import MODES, compare_runs
from support.builtin_envs import random_actions

import envd

NUM_ENVS = 5
STEPS = 60
LIMIT = 25  # a short time limit: every run ends episodes by truncation too
#: the test fixtures (tests/hosted/envs.py): a Dict-observation env with Tuple
#: actions and infos, and a MultiDiscrete-action env with Tuple observations
FIXTURES = ("envd-test/DictObs-v0", "envd-test/MultiDiscrete-v0")

CASES = ([("CartPole-v1", w, m) for w in (0, 1, 2, 3) for m in MODES]
         + [(e, w, "next_step") for e in ("Acrobot-v1", "Pendulum-v1", *FIXTURES)
            for w in (0, 1, 2, 3)]
         + [(e, 2, m) for e in ("Acrobot-v1", "Pendulum-v1", *FIXTURES)
            for m in ("same_step", "disabled")])


def envd_id(env_id: str) -> str:
    """The id envd.make takes: a fixture's through its module (imported where
    the env is made: the template or this process)."""
    return "py:" + ("daemon_envs:" + env_id if env_id in FIXTURES else env_id)


@pytest.mark.parametrize("env_id,num_workers,mode", CASES)
def test_equal_to_sync_vector_env(env_id, num_workers, mode):
    ref = gym.make_vec(env_id, NUM_ENVS, vectorization_mode="sync", max_episode_steps=LIMIT,
                       vector_kwargs={"autoreset_mode": MODES[mode]})
    env = envd.make(envd_id(env_id), NUM_ENVS, seed=7, num_workers=num_workers,
                    autoreset_mode=mode, max_episode_steps=LIMIT, episode_statistics=False)
    try:
        assert env.num_workers == num_workers and len(env.worker_pids) == num_workers
        compare_runs(env, ref, mode, STEPS, seed=7, masked_reset_at=30)
    finally:
        env.close()
        ref.close()


@pytest.mark.parametrize("num_workers,mode", [(0, m) for m in MODES] + [(2, m) for m in MODES])
def test_episode_statistics(num_workers, mode):
    """info["episode"] (episode_statistics="episode") holds each ended
    episode's return and length, as RecordEpisodeStatistics sums them."""
    ref = gym.make_vec("CartPole-v1", NUM_ENVS, vectorization_mode="sync",
                       max_episode_steps=LIMIT, vector_kwargs={"autoreset_mode": MODES[mode]})
    env = envd.make("py:CartPole-v1", NUM_ENVS, seed=7, num_workers=num_workers,
                    autoreset_mode=mode, max_episode_steps=LIMIT, episode_statistics="episode")
    try:
        env.reset()
        ref.reset(seed=7)
        rng = np.random.default_rng(1)
        returns, lengths = np.zeros(NUM_ENVS), np.zeros(NUM_ENVS, np.int64)
        ref_done = np.zeros(NUM_ENVS, bool)
        for t in range(STEPS):
            if mode == "disabled" and ref_done.any():  # the caller resets done envs
                env.reset(options={"reset_mask": ref_done.copy()})
                ref.reset(options={"reset_mask": ref_done.copy()})
                returns[ref_done], lengths[ref_done] = 0, 0
            actions = random_actions(env.single_action_space, NUM_ENVS, rng)
            _, _, term, trunc, info = env.step(actions)
            _, ref_rew, _, _, _ = ref.step(actions)
            done = term | trunc
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
