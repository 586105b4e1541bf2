"""Acrobot-v1 (native/src/envs/acrobot.c) against gymnasium's AcrobotEnv, bit for bit."""
import ctypes

import cbuild
import gymnasium as gym
import numpy as np
import pytest

STEPS = 10_000


@pytest.fixture(scope="module")
def lib():
    return cbuild.load(["rng.c", "raster.c", "npy_f32_trig.c", "envs/acrobot.c"])


def make_pair(lib, seed):
    """The C env and gymnasium's (unwrapped: no TimeLimit), both reset with seed."""
    env = cbuild.SingleEnv(lib, "envd_builtin_acrobot")
    ref = gym.make("Acrobot-v1").unwrapped
    obs = env.reset(seed)
    ref_obs, _ = ref.reset(seed=seed)
    assert obs.tobytes() == ref_obs.tobytes(), (obs, ref_obs)
    return env, ref


def test_definition(lib):
    d = cbuild.EnvDef.in_dll(lib, "envd_builtin_acrobot")
    ref = gym.make("Acrobot-v1")
    assert d.abi_version == cbuild.ABI_VERSION
    assert d.id == b"Acrobot-v1"
    assert d.num_agents == 1
    assert d.max_episode_steps == ref.spec.max_episode_steps == 500
    assert d.num_params == 0 and not d.params
    assert d.state_size > 0

    obs = d.observation_space
    assert (obs.kind, obs.dtype, obs.ndim, obs.shape[0]) == (0, 0, 1, 6)
    low = np.ctypeslib.as_array(obs.low, (6,))
    high = np.ctypeslib.as_array(obs.high, (6,))
    space = ref.observation_space
    assert space.dtype == np.float32 and space.shape == (6,)
    # the bounds are float32-representable doubles equal to gymnasium's
    assert np.array_equal(low.astype(np.float32).astype(np.float64), low)
    assert np.array_equal(high.astype(np.float32).astype(np.float64), high)
    assert low.astype(np.float32).tobytes() == space.low.tobytes()
    assert high.astype(np.float32).tobytes() == space.high.tobytes()

    act = d.action_space
    assert (act.kind, act.dtype, act.n, act.start) == (1, 2, 3, 0)
    assert ref.action_space == gym.spaces.Discrete(3)


@pytest.mark.parametrize("seed", [0, 1, 123])
def test_matches_gymnasium(lib, seed):
    env, ref = make_pair(lib, seed)
    actions = np.random.default_rng(seed + 1000).integers(0, 3, STEPS)
    episodes = 1
    for t, a in enumerate(actions):
        obs, reward, term, trunc = env.step(a)
        ref_obs, ref_reward, ref_term, ref_trunc, _ = ref.step(int(a))
        assert obs.tobytes() == ref_obs.tobytes(), (t, obs, ref_obs)
        assert np.float32(reward) == np.float32(ref_reward), (t, reward, ref_reward)
        assert term == ref_term and trunc == ref_trunc is False, t
        if term:
            # reset without a seed continues each env's generator
            obs, (ref_obs, _) = env.reset(), ref.reset()
            assert obs.tobytes() == ref_obs.tobytes(), (t, obs, ref_obs)
            episodes += 1
    assert episodes > 1  # the terminal condition and mid-run resets were exercised


@pytest.mark.parametrize("seed", [0, 1, 123])
def test_reset_observations(lib, seed):
    """Reset observations apply numpy's float32 sin/cos (not libm sinf/cosf,
    which differs for about 1% of them): check many consecutive resets."""
    env, ref = make_pair(lib, seed)
    for i in range(2000):
        obs, (ref_obs, _) = env.reset(), ref.reset()
        assert obs.tobytes() == ref_obs.tobytes(), (i, obs, ref_obs)


def test_invalid_action_is_rejected(lib):
    env = cbuild.SingleEnv(lib, "envd_builtin_acrobot")
    env.reset(0)
    for a in (-1, 3):
        env.action[...] = a
        reward = ctypes.c_double()
        term, trunc = ctypes.c_bool(), ctypes.c_bool()
        rc = env.define.step(env._state, ctypes.byref(env.rng), env.action.ctypes.data,
                             env.obs.ctypes.data, ctypes.byref(reward), ctypes.byref(term),
                             ctypes.byref(trunc))
        assert rc == -3  # ENVD_ERANGE
