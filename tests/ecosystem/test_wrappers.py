"""gymnasium's standard vector wrappers on a default envd env, in-process and
through a daemon: the CleanRL-style stack (RecordEpisodeStatistics,
ClipAction / RescaleAction, NormalizeObservation, NormalizeReward, and the
clipping transforms) runs, gymnasium's statistics (info["episode"]) agree with
envd's own (info["envd_episode"], still there), and the actions the envs get
are the wrappers' (a twin stepped with them reports the same episodes)."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.wrappers import vector as wrappers
from gymnasium.wrappers.utils import rescale_box

import envd

STEPS = 600
NUM_ENVS = 4
LIMIT = 150  # a time limit: episodes of every env end within the run


def cleanrl_stack(env: gym.vector.VectorEnv, continuous: bool,
                  rescale: bool = False) -> gym.vector.VectorEnv:
    """CleanRL's wrappers (ppo.py for discrete actions; ppo_continuous_action.py
    for continuous ones), in vector form; stack.statistics is the
    RecordEpisodeStatistics wrapper."""
    env = statistics = wrappers.RecordEpisodeStatistics(env)
    if continuous:
        env = wrappers.RescaleAction(env, -1.0, 1.0) if rescale else wrappers.ClipAction(env)
    env = wrappers.NormalizeObservation(env)
    env = wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10),
                                        env.observation_space)
    env = wrappers.NormalizeReward(env, gamma=0.99)
    env = wrappers.TransformReward(env, lambda reward: np.clip(reward, -10, 10))
    env.statistics = statistics
    return env


def env_actions(space: gym.spaces.Space, actions: np.ndarray, rescale: bool) -> np.ndarray:
    """What ClipAction / RescaleAction hand the env for actions (as gymnasium computes it)."""
    if not isinstance(space, gym.spaces.Box):
        return actions
    if rescale:  # gymnasium's own function, env by env as its vector wrapper applies it
        _, _, rescale_row = rescale_box(space, -1.0, 1.0)
        return np.stack([rescale_row(row) for row in actions]).astype(space.dtype)
    return np.clip(actions, space.low, space.high).astype(space.dtype)


def run_stack(make, env_id: str, rescale: bool = False) -> int:
    """Drive the stack over make(env_id) (time limit LIMIT) beside an unwrapped envd twin fed the
    actions the wrappers pass on; returns the episodes the wrapper counted."""
    env = make(env_id)
    continuous = isinstance(env.single_action_space, gym.spaces.Box)
    stack = cleanrl_stack(env, continuous, rescale)
    twin = envd.make(env_id, NUM_ENVS, seed=1, max_episode_steps=LIMIT)
    stack.reset(seed=1)
    twin.reset(seed=1)
    rng = np.random.default_rng(0)
    episodes = 0
    for _ in range(STEPS):
        if continuous:  # beyond the bounds: ClipAction must clip them
            shape = (NUM_ENVS, *env.single_action_space.shape)
            actions = rng.uniform(-1.5, 1.5, shape).astype(np.float32)
            if not rescale:
                actions *= env.single_action_space.high
        else:
            actions = rng.integers(0, env.single_action_space.n, NUM_ENVS)
        obs, rewards, terminations, truncations, info = stack.step(actions)
        *_, twin_info = twin.step(env_actions(env.single_action_space, actions, rescale))
        assert np.isfinite(obs).all() and np.abs(obs).max() <= 10
        assert np.isfinite(rewards).all() and rewards.dtype.kind == "f"
        assert ("episode" in info) == ("envd_episode" in info) == ("envd_episode" in twin_info)
        if "episode" in info:
            ours, theirs = info["envd_episode"], info["episode"]
            np.testing.assert_array_equal(info["_episode"], info["_envd_episode"])
            np.testing.assert_array_equal(info["_episode"], twin_info["_envd_episode"])
            done = info["_episode"]
            # envd sums the rewards before their float32 rounding: equal to within
            # float32 precision (exactly for integer rewards)
            np.testing.assert_allclose(theirs["r"][done], ours["r"][done], rtol=1e-6)
            np.testing.assert_array_equal(theirs["l"][done], ours["l"][done])
            np.testing.assert_array_equal(ours["r"], twin_info["envd_episode"]["r"])
            episodes += int(done.sum())
    assert stack.statistics.episode_count == episodes
    assert len(stack.statistics.return_queue) == min(episodes, 100)
    stack.close()
    twin.close()
    return episodes


CASES = [("CartPole-v1", False), ("Acrobot-v1", False), ("Pendulum-v1", False),
         ("Pendulum-v1", True), ("MountainCarContinuous-v0", False)]


@pytest.mark.parametrize("env_id, rescale", CASES)
def test_cleanrl_stack_in_process(env_id, rescale):
    def make(env_id):
        return gym.make_vec(f"envd/{env_id}", num_envs=NUM_ENVS, seed=1,
                            max_episode_steps=LIMIT)
    episodes = run_stack(make, env_id, rescale)
    assert episodes >= NUM_ENVS


@pytest.mark.parametrize("env_id, rescale", CASES[:1] + CASES[3:4])
def test_cleanrl_stack_through_the_daemon(daemon, env_id, rescale):
    client = daemon.connect()

    def make(env_id):
        return client.make(env_id, NUM_ENVS, seed=1, max_episode_steps=LIMIT)
    assert run_stack(make, env_id, rescale) >= NUM_ENVS
    client.close()


def test_record_episode_statistics_same_step_autoreset():
    """RecordEpisodeStatistics follows same_step autoreset too (the mode SB3
    and CleanRL-style bootstrapping use; gymnasium's observation and reward
    normalisers accept only next_step and disabled)."""
    env = wrappers.RecordEpisodeStatistics(
        envd.make("CartPole-v1", NUM_ENVS, seed=1, autoreset_mode="same_step"))
    env.reset(seed=1)
    episodes = 0
    for _ in range(STEPS):
        *_, info = env.step(np.ones(NUM_ENVS, np.int64))
        assert ("episode" in info) == ("envd_episode" in info)
        if "episode" in info:
            done = info["_episode"]
            np.testing.assert_array_equal(done, info["_envd_episode"])
            np.testing.assert_array_equal(info["episode"]["l"][done],
                                          info["envd_episode"]["l"][done])
            np.testing.assert_array_equal(info["episode"]["r"][done],
                                          info["envd_episode"]["r"][done])
            episodes += int(done.sum())
    assert episodes > NUM_ENVS
    env.close()


def mapped_segments() -> set[str]:
    """The envd segments this process maps."""
    with open("/proc/self/maps") as maps:
        return {line.split()[-1] for line in maps if "/dev/shm/envd-" in line}


def test_bad_episode_statistics_keys_through_the_daemon(daemon):
    """A bad key is refused by the client before the daemon makes anything; a
    key that is one of the env's info fields is refused once the env's fields
    are known, and the session made for it is freed: nothing stays behind."""
    client = daemon.connect()
    mapped_before = mapped_segments()  # earlier tests' envs may not be collected yet
    with pytest.raises(envd.InvalidArgumentError, match="episode_statistics must be"):
        client.make("CartPole-v1", 2, episode_statistics="_envd_episode")
    with pytest.raises(envd.InvalidArgumentError, match="info field 'action_mask'"):
        client.make("ConnectFour-v0", 2, episode_statistics="action_mask")
    status = client.status()
    assert status["sessions"] == 0 and status["envs"] == 0
    assert mapped_segments() <= mapped_before, "a refused make left its segment mapped"
    with client.make("ConnectFour-v0", 2, seed=0, episode_statistics="stats") as env:
        assert env.episode_statistics_key == "stats"
    client.close()
