"""Info columns (docs/python-envs.md, "Infos"): an env's scalar and
fixed-shape array info values travel as columns of the segment, an info
that deviates from them (a type, a key, a shape) through the codec, and
with num_workers=0 nothing is encoded at all; the merged info equals
gymnasium's SyncVectorEnv's, "_" masks and dtypes included, in every
autoreset mode, sync and async."""
from __future__ import annotations

import daemon_envs  # noqa: F401  (registers the envd-test/ ids in this process)
import gymnasium as gym
import numpy as np
import pytest
from equivalence import MODES, assert_same, async_env_runs, compare_runs, per_env_action_batches, sync_env_runs

import envd
from envd.native.hosted_template import _describe
from envd.native.hosted_worker import INFO_COLUMN_MIN_STEPS, info_columns

ENV_ID = "envd-test/ColumnInfo-v0"
NUM_ENVS, STEPS = 4, 110  # past each env's 64th step: the deviations


def test_the_description_picks_the_columns():
    described = _describe(("id", "daemon_envs:" + ENV_ID, None, {}))
    assert described["info_columns"] == (
        ("x", "<f8", ()), ("n", "<i8", ()), ("ok", "|b1", ()), ("f32", "<f4", ()),
        ("i16", "<i2", ()), ("vec", "<f4", (2,)))


def test_columns_only_for_infos_that_agree():
    same = [{"a": 1.0, "b": np.int32(2)}] * INFO_COLUMN_MIN_STEPS
    assert info_columns(same) == (("a", "<f8", ()), ("b", "<i4", ()))
    assert info_columns(same[:-1]) == ()  # too few steps
    assert info_columns(same[:-1] + [{"a": 1, "b": np.int32(2)}]) == ()  # a type changed
    assert info_columns(same[:-1] + [{"a": 1.0}]) == ()  # a key went
    assert info_columns([{"a": "text"}] * 8) == ()  # not a number
    assert info_columns([{"a": np.bool_(True)}] * 8) == ()  # gymnasium: an object array
    assert info_columns([{"a": {"b": 1.0}}] * 8) == ()  # nested
    assert info_columns([{"a": np.zeros(600)}] * 8) == ()  # over MAX_INFO_COLUMN_BYTES
    assert info_columns([dict.fromkeys(map(str, range(65)), 1.0)] * 8) == ()  # too many keys


@pytest.mark.parametrize("num_workers,mode", [(w, "next_step") for w in (0, 1, 2)]
                         + [(2, m) for m in ("same_step", "disabled")] + [(0, "same_step")])
def test_equal_to_sync_vector_env(num_workers, mode):
    ref = gym.make_vec(ENV_ID, NUM_ENVS, vectorization_mode="sync",
                       vector_kwargs={"autoreset_mode": MODES[mode]})
    env = envd.make("py:daemon_envs:" + ENV_ID, NUM_ENVS, seed=5, num_workers=num_workers,
                    autoreset_mode=mode, episode_statistics=False)
    try:
        assert "info_column.vec" in env._buffers  # (the columns are in use)
        compare_runs(env, ref, mode, STEPS, seed=5, masked_reset_at=40)
    finally:
        env.close()
        ref.close()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_async_recv_infos_equal_each_env_stepped_alone(num_workers):
    """(Before the deviations: a deviating value's batched type depends on
    which envs share its batch, gymnasium's merge being by the first env.)"""
    steps = 60
    actions = per_env_action_batches(gym.spaces.Discrete(3), NUM_ENVS, steps, seed=2)
    ref = gym.make_vec(ENV_ID, NUM_ENVS, vectorization_mode="sync")
    env = envd.make("py:daemon_envs:" + ENV_ID, NUM_ENVS, seed=3, num_workers=num_workers,
                    batch_size=2, episode_statistics=False)
    try:
        expected = sync_env_runs(ref, actions, steps, seed=3)
        got = async_env_runs(env, actions, steps, np.random.default_rng(4))
        for i in range(NUM_ENVS):
            assert_same(got[i], expected[i][:len(got[i])], f"env {i}")
    finally:
        env.close()
        ref.close()


class ObjectInfoEnv(gym.Env):
    """An info value msgpack cannot carry (a plain object)."""
    observation_space = gym.spaces.Discrete(2)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return 0, {"handle": self}

    def step(self, action):
        return 0, 0.0, False, False, {}


def test_in_the_caller_any_info_is_carried_as_it_is():
    """With num_workers=0 an info is never encoded: any value, as
    SyncVectorEnv carries it (an object array holding the very objects)."""
    with envd.make(ObjectInfoEnv, 2, num_workers=0, info_bytes=16) as env:
        _, info = env.reset()
        assert info["handle"].dtype == object and all(info["_handle"])
        assert all(isinstance(h, ObjectInfoEnv) for h in info["handle"])


def test_long_keys_get_no_columns():
    assert info_columns([{"k" * 129: 1.0}] * 8) == ()
    assert info_columns([{"k" * 128: 1.0}] * 8) == (("k" * 128, "<f8", ()),)


def test_the_daemon_counts_the_columns_in_both_segments():
    """A daemon session's columns are part of its client segment (what
    --max-shm-bytes counts) and of its private one (--max-state-bytes)."""
    import dataclasses

    from gymnasium.vector import AutoresetMode

    from envd.server.hosted import HostedEnvSpec, hosted_state_plan, public_plan
    plain = HostedEnvSpec("py:X-v0", "X-v0", gym.spaces.Box(-1, 1, (3,)),
                          gym.spaces.Discrete(2), None, 1e-6)
    wide = dataclasses.replace(plain, info_columns=(("a", "<f8", (64,)),))
    mode, n, column = AutoresetMode.NEXT_STEP, 1000, 1000 * 64 * 8
    assert public_plan(wide, n, mode, 16)[1] >= public_plan(plain, n, mode, 16)[1] + column
    assert hosted_state_plan(wide, n, 1, mode, 16) >= hosted_state_plan(plain, n, 1, mode, 16) \
        + column
    # (no info slots: no columns either)
    assert public_plan(wide, n, mode, 0)[1] == public_plan(plain, n, mode, 0)[1]
