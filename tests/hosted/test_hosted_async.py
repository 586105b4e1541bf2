"""Async mode (batch_size < num_envs: async_reset/send/recv) with hosted
Python envs: per env, the same trajectory as gymnasium's SyncVectorEnv, for
worker counts 0 to 3 and random send orders; the native session's refusals."""
from __future__ import annotations

import functools

import daemon_envs  # noqa: F401  (registers the envd-test/ ids)
import gymnasium as gym
import numpy as np
import pytest
from equivalence import MODES, assert_same, async_env_runs, per_env_action_batches, sync_env_runs
from gymnasium.vector import AutoresetMode
from support.async_steps import async_trajectories, per_env_actions

import envd

NUM_ENVS, STEPS, BATCH = 6, 40, 2


def gymnasium_trajectories(env_id, actions, mode):
    """Per env: its reset observation, then (obs, reward, term, trunc, final)
    per step, from gymnasium's SyncVectorEnv seeded 11 (as async_trajectories)."""
    ref = gym.make_vec(env_id, NUM_ENVS, vectorization_mode="sync",
                       vector_kwargs={"autoreset_mode": mode})
    obs, _ = ref.reset(seed=11)
    obs = obs.astype(np.float32)
    runs = [[("reset", obs[i].tobytes())] for i in range(NUM_ENVS)]
    for t in range(STEPS):
        obs, rew, term, trunc, info = ref.step(actions[t])
        obs = obs.astype(np.float32)
        for i in range(NUM_ENVS):
            final = (np.asarray(info["final_obs"][i], np.float32).tobytes()
                     if info.get("_final_obs", np.zeros(NUM_ENVS, bool))[i] else None)
            runs[i].append((obs[i].tobytes(), float(rew[i]), bool(term[i]),
                            bool(trunc[i]), final))
    ref.close()
    return runs


@pytest.mark.parametrize("num_workers", [0, 1, 2, 3])
@pytest.mark.parametrize("mode", ["next_step", "same_step"])
@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_async_equals_sync(env_id, mode, num_workers):
    space = gym.make(env_id).action_space
    actions = per_env_actions(space, NUM_ENVS, STEPS, seed=5)
    expected = gymnasium_trajectories(env_id, actions, AutoresetMode(
        {"next_step": "NextStep", "same_step": "SameStep"}[mode]))
    make = functools.partial(envd.make, "py:" + env_id, NUM_ENVS, seed=11,
                             num_workers=num_workers, autoreset_mode=mode)
    runs, received = async_trajectories(make, NUM_ENVS, STEPS, actions, BATCH,
                                         np.random.default_rng(num_workers))
    # (the run ends when fewer than a batch are outstanding: an env may stop short)
    assert received.sum() >= NUM_ENVS * STEPS
    for i in range(NUM_ENVS):
        assert len(runs[i]) == received[i] >= 1
        assert runs[i] == expected[i][:received[i]], f"env {i}"


@pytest.mark.parametrize("num_workers", [0, 2])
def test_async_refusals_keep_the_env_usable(num_workers):
    with envd.make("py:CartPole-v1", 4, seed=0, num_workers=num_workers,
                   batch_size=2) as env:
        env.async_reset()
        _, _, _, _, info = env.recv()
        ids = info["env_id"]
        with pytest.raises(envd.EnvStateError):  # ready, not received yet
            env.send(np.zeros(1, np.int64), np.array([int(set(range(4)).difference(ids).pop())]))
        with pytest.raises(envd.InvalidActionError):  # out of Discrete(2)
            env.send(np.array([0, 5]), ids)
        env.send(np.zeros(2, np.int64), ids)
        with pytest.raises(envd.EnvStateError):  # a whole step while envs are async
            env.step(np.zeros(4, np.int64))
        got = set()
        for _ in range(2):
            got.update(env.recv()[4]["env_id"].tolist())
        assert got == {0, 1, 2, 3}


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("mode", ["next_step", "same_step"])
def test_async_dict_spaces_and_infos_equal_sync(mode, num_workers):
    """Dict observations, Tuple actions and infos (tests/hosted/envs.py's
    DictObsEnv): each env's records through async_reset/recv/send, in random
    send orders, equal its records in gymnasium's SyncVectorEnv, infos
    included (each row's own keys of the merged info)."""
    env_id = "envd-test/DictObs-v0"
    ref = gym.make_vec(env_id, NUM_ENVS, vectorization_mode="sync",
                       vector_kwargs={"autoreset_mode": MODES[mode]})
    actions = per_env_action_batches(ref.single_action_space, NUM_ENVS, STEPS, seed=4)
    expected = sync_env_runs(ref, actions, STEPS, seed=11)
    ref.close()
    with envd.make("py:daemon_envs:" + env_id, NUM_ENVS, seed=11, num_workers=num_workers,
                   autoreset_mode=mode, batch_size=BATCH, episode_statistics=False) as env:
        runs = async_env_runs(env, actions, STEPS, np.random.default_rng(num_workers))
    assert sum(map(len, runs)) >= NUM_ENVS * STEPS
    for i in range(NUM_ENVS):
        assert_same(runs[i], expected[i][:len(runs[i])], f"env {i}")


def test_a_recvs_dict_observation_is_the_callers_to_change():
    """Each recv returns a new dict of a Dict space's observation (its arrays
    are views of recv's two alternating batch buffers, as documented): an
    entry the caller replaced in one recv's dict is not handed back two recvs
    later (a cached dict did that: the stale array in place of fresh rows)."""
    with envd.make("py:daemon_envs:envd-test/DictObs-v0", 4, seed=3, num_workers=0,
                   batch_size=2, episode_statistics=False) as env:
        env.async_reset()
        actions = [np.zeros(2, np.int64), np.array([[1, 0], [0, 1]]), np.zeros((2, 2), np.float32)]
        dicts = []
        for k in range(3):
            obs, *_, info = env.recv()
            dicts.append(obs)
            if k == 0:
                for key in obs:
                    obs[key] = "replaced by the caller"
            env.send(tuple(actions), info["env_id"])
        assert dicts[2] is not dicts[0]
        assert all(not isinstance(value, str) for value in dicts[2].values()), dicts[2]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_recv_infos_are_batch_sized_and_wide_integers_refused(num_workers):
    """An async recv's merged env infos are batch_size long, row k being env
    env_id[k] (as its observations are), not num_envs long; an integer that
    does not fit a leaf's narrow dtype (MultiBinary: int8) is refused, never
    wrapped into a valid value."""
    box = np.zeros((2, 2), np.float32)
    with envd.make("py:daemon_envs:envd-test/DictObs-v0", 8, seed=3, num_workers=num_workers,
                   batch_size=2, episode_statistics=False) as env:
        env.async_reset()
        seen = 0
        for _ in range(40):
            obs, rew, term, trunc, info = env.recv()
            ids = info["env_id"]
            assert len(ids) == 2 and len(rew) == 2
            for key, value in info.items():
                if not isinstance(value, dict):
                    assert len(value) == 2, (key, len(value))
            if "t" in info:
                seen += 1
                for k in np.flatnonzero(info["_t"]):
                    # (DictObsEnv's step info "t" is its env's step count)
                    assert info["t"][k] >= 1, (info, k)
            with pytest.raises(envd.InvalidActionError, match=r"action\[1\] 257 of env"):
                env.send((np.zeros(2, np.int64), np.array([[257, 0], [0, 1]]), box), ids)
            env.send((np.zeros(2, np.int64), np.array([[1, 0], [0, 1]]), box), ids)
        assert seen, "no step info came in 40 batches"
