"""Arrays an off-policy loop keeps: gymnasium.make_vec("envd/<id>") copies
what it returns by default (gymnasium's ``copy=True``, as SyncVectorEnv), so
CleanRL's DQN/SAC loop shape (``obs = next_obs`` then ``rb.add(obs,
real_next_obs, ...)``) stores the transitions gymnasium's own SyncVectorEnv
stores, in-process and through the daemon; envd.make keeps its views
(DESIGN section 4) and says so."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import envd

NUM_ENVS, STEPS, SEED = 4, 60, 7


def dqn_shaped_loop(envs) -> list[tuple[np.ndarray, ...]]:
    """CleanRL dqn.py's data collection with a random policy: a replay buffer
    that copies what it is given at add (as SB3's ReplayBuffer.add does)."""
    rng = np.random.default_rng(SEED)
    buffer = []
    obs, _ = envs.reset(seed=SEED)
    for _ in range(STEPS):
        actions = rng.integers(0, 2, size=NUM_ENVS)
        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        real_next_obs = next_obs.copy()
        buffer.append((np.array(obs), real_next_obs, actions, np.array(rewards),
                       np.array(terminations)))
        obs = next_obs
    envs.close()
    return buffer


def gymnasium_reference() -> list[tuple[np.ndarray, ...]]:
    """The same loop over gymnasium's own CartPole-v1 in its SyncVectorEnv."""
    return dqn_shaped_loop(gym.make_vec("CartPole-v1", num_envs=NUM_ENVS,
                                        vectorization_mode="sync"))


def assert_transitions_sound(buffer, reference) -> None:
    """Every stored s differs from its s' (CartPole's state moves every step),
    and the buffer equals gymnasium's, transition by transition: states bit
    for bit, rewards equal as float32 (gymnasium's vector rewards are float64)."""
    assert len(buffer) == len(reference) == STEPS
    for t, (got, want) in enumerate(zip(buffer, reference)):
        assert not np.array_equal(got[0], got[1]), f"transition {t} stored s' as s"
        for name, a, b in zip(("s", "s'"), got, want):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), \
                f"transition {t}: {name} differs from gymnasium's"
        for name, a, b in zip(("a", "r", "term"), got[2:], want[2:]):
            assert np.array_equal(a, b.astype(a.dtype)), \
                f"transition {t}: {name} differs from gymnasium's"


def test_reference_loop_stores_distinct_states():
    """The reference itself: gymnasium's SyncVectorEnv (copy=True) never
    stores s' as s, and each s is the s' before it (autoreset steps aside)."""
    reference = gymnasium_reference()
    assert all(not np.array_equal(s, s2) for s, s2, *_ in reference)
    assert np.array_equal(reference[1][0], reference[0][1])


def test_make_vec_in_process_stores_correct_transitions():
    envs = gym.make_vec("envd/CartPole-v1", num_envs=NUM_ENVS)
    assert isinstance(envs, envd.VecEnv)
    assert_transitions_sound(dqn_shaped_loop(envs), gymnasium_reference())


def test_make_vec_through_the_daemon_stores_correct_transitions(daemon):
    envs = gym.make_vec("envd/CartPole-v1", num_envs=NUM_ENVS, endpoint=daemon.endpoint)
    assert isinstance(envs, envd.RemoteVecEnv)
    assert_transitions_sound(dqn_shaped_loop(envs), gymnasium_reference())


@pytest.mark.parametrize("make", [
    lambda: gym.make_vec("envd/CartPole-v1", num_envs=NUM_ENVS, copy=False),
    lambda: envd.make("CartPole-v1", NUM_ENVS),
], ids=["make_vec copy=False", "envd.make"])
def test_views_are_overwritten_by_the_next_step(make):
    """copy=False (envd.make's default) returns views: the same arrays every
    step, so the loop above stores s' as s: what the docs warn about."""
    envs = make()
    obs, _ = envs.reset(seed=SEED)
    next_obs, rewards, *_ = envs.step(np.zeros(NUM_ENVS, np.int64))
    assert next_obs is obs or np.shares_memory(next_obs, obs)
    buffer = dqn_shaped_loop(envs)
    assert all(np.array_equal(s, s2) for s, s2, *_ in buffer)


def test_envd_make_copies_when_asked():
    with envd.make("CartPole-v1", NUM_ENVS, copy=True) as envs:
        obs, _ = envs.reset(seed=SEED)
        next_obs, *_ = envs.step(np.zeros(NUM_ENVS, np.int64))
        assert not np.shares_memory(next_obs, obs)
        assert_transitions_sound(dqn_shaped_loop(envs), gymnasium_reference())
