"""Pendulum-v1, MountainCar-v0 and MountainCarContinuous-v0 (native/src/envs/)
against gymnasium, bit for bit.

The reference is gymnasium.make(id, **kwargs).unwrapped (no TimeLimit, no
checker).  Both sides are driven by the same actions from a separate numpy
generator and are reset together; a reset without a seed continues each
env's own RNG.  Observations must be bit-equal, rewards equal as doubles
(gymnasium returns Python floats or np.float64), terminated equal.

The state-injection tests write the leading doubles of a C state block
(position/velocity, th/thdot: the C structs keep them first for this) and the
same values into gymnasium's env.state, to reach branches a stock episode
rarely reaches: the speed and wall clamps, exact boundary values.
"""
import ctypes
import inspect
import math

import cbuild
import gymnasium as gym
import numpy as np
import pytest

SOURCES = ["rng.c", "raster.c", "envs/pendulum.c", "envs/mountain_car.c",
           "envs/mountain_car_continuous.c"]
ENVS = {  # key: (gymnasium id, C symbol)
    "pendulum": ("Pendulum-v1", "envd_builtin_pendulum"),
    "mountain_car": ("MountainCar-v0", "envd_builtin_mountain_car"),
    "mountain_car_continuous": ("MountainCarContinuous-v0",
                                "envd_builtin_mountain_car_continuous"),
}
SEEDS = [0, 1, 123]
STEPS = 4000
f32 = np.float32


@pytest.fixture(scope="module")
def lib():
    return cbuild.load(SOURCES)


def make_pair(lib, key, kwargs=None):
    gym_id, symbol = ENVS[key]
    kwargs = kwargs or {}
    return gym.make(gym_id, **kwargs).unwrapped, cbuild.SingleEnv(lib, symbol, params=kwargs)


# ---- policies: (action rng, last reference obs) -> action ---------------------
def pendulum_policy(rng, obs):
    if rng.random() < 0.5:  # pump energy so thdot reaches the max_speed clip
        return np.array([2.5 if obs[2] >= 0 else -2.5], f32)
    return rng.uniform(-3, 3, size=1).astype(f32)  # beyond [-2, 2] too


def mountain_car_policy(rng, obs):
    if rng.random() < 0.8:  # push along the velocity: reaches the goal
        return np.int64(2 if obs[1] >= 0 else 0)
    return np.int64(rng.integers(0, 3))


def continuous_policy(rng, obs):
    if rng.random() < 0.7:
        mag = rng.uniform(0.5, 3.0)
        return np.array([mag if obs[1] >= 0 else -mag], f32)
    return rng.uniform(-3, 3, size=1).astype(f32)  # beyond [-1, 1] too


POLICIES = {"pendulum": pendulum_policy, "mountain_car": mountain_car_policy,
            "mountain_car_continuous": continuous_policy}


def assert_step_equal(got, want, ctx):
    obs, reward, term, trunc = got
    w_obs, w_reward, w_term, w_trunc = want
    assert obs.dtype == w_obs.dtype == np.float32, ctx
    assert obs.tobytes() == w_obs.tobytes(), (ctx, obs, w_obs)
    assert reward == float(w_reward), (ctx, reward, w_reward)  # the double itself
    assert f32(reward) == f32(w_reward), ctx
    assert term == w_term, ctx
    assert not trunc and not w_trunc, ctx


def run_episodes(lib, key, kwargs, seed, steps=STEPS):
    """Step both envs `steps` times; reset on termination and every
    max_episode_steps (as TimeLimit would).  Returns the number of
    terminations."""
    ref, env = make_pair(lib, key, kwargs)
    limit = env.define.max_episode_steps
    act_rng = np.random.default_rng(10_000 + seed)
    w_obs, _ = ref.reset(seed=seed)
    obs = env.reset(seed)
    assert obs.tobytes() == w_obs.tobytes()
    terminations, t_episode = 0, 0
    for t in range(steps):
        action = POLICIES[key](act_rng, w_obs)
        got = env.step(action)
        w_obs, w_reward, w_term, w_trunc, _ = ref.step(action)
        assert_step_equal(got, (w_obs, w_reward, w_term, w_trunc), (key, seed, t, action))
        t_episode += 1
        if w_term or t_episode == limit:
            terminations += bool(w_term)
            t_episode = 0
            w_obs, _ = ref.reset()
            obs = env.reset()
            assert obs.tobytes() == w_obs.tobytes(), (key, seed, t, "reset")
    return terminations


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("key", list(ENVS))
def test_matches_gymnasium(lib, key, seed):
    terminations = run_episodes(lib, key, {}, seed)
    if key != "pendulum":
        assert terminations > 0, "the policy should reach the goal"


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("key,kwargs", [
    ("pendulum", {"g": 9.81}),
    ("mountain_car", {"goal_velocity": 0.01}),
    ("mountain_car_continuous", {"goal_velocity": 0.01}),
])
def test_matches_gymnasium_with_kwargs(lib, key, kwargs, seed):
    terminations = run_episodes(lib, key, kwargs, seed)
    if key != "pendulum":
        assert terminations > 0


# ---- spaces, limits, params ---------------------------------------------------
def c_box_bounds(space):
    n = int(np.prod([space.shape[i] for i in range(space.ndim)]))
    return (np.array([space.low[i] for i in range(n)]),
            np.array([space.high[i] for i in range(n)]))


def assert_space_equal(c_space, g_space):
    if isinstance(g_space, gym.spaces.Discrete):
        assert c_space.kind == 1 and c_space.dtype == 2 and c_space.ndim == 0
        assert (c_space.n, c_space.start) == (int(g_space.n), int(g_space.start))
        return
    assert c_space.kind == 0
    assert cbuild.DTYPES[c_space.dtype] == g_space.dtype
    assert tuple(c_space.shape[i] for i in range(c_space.ndim)) == g_space.shape
    low, high = c_box_bounds(c_space)
    # The C bounds are doubles equal to gymnasium's float32 bounds.
    assert low.tobytes() == g_space.low.astype(np.float64).ravel().tobytes()
    assert high.tobytes() == g_space.high.astype(np.float64).ravel().tobytes()


@pytest.mark.parametrize("key", list(ENVS))
def test_spaces_limits_and_params(lib, key):
    gym_id, symbol = ENVS[key]
    ref = gym.make(gym_id).unwrapped
    d = cbuild.EnvDef.in_dll(lib, symbol)
    assert d.id.decode() == gym_id
    assert d.max_episode_steps == gym.spec(gym_id).max_episode_steps
    assert d.num_agents == 1
    assert_space_equal(d.observation_space, ref.observation_space)
    assert_space_equal(d.action_space, ref.action_space)
    kwargs = {k: p.default for k, p in inspect.signature(type(ref).__init__).parameters.items()
              if k not in ("self", "render_mode")}
    params = {d.params[i].name.decode(): d.params[i] for i in range(d.num_params)}
    assert set(params) == set(kwargs)
    for name, default in kwargs.items():
        p = params[name]
        assert p.type == 0 and p.default_value == default
        assert p.min_value <= p.default_value <= p.max_value


# ---- state injection ------------------------------------------------------------
def set_c_state(env, *values):
    """Overwrite the leading doubles of the C state block (the C structs keep
    th/thdot or position/velocity first for this)."""
    assert env.define.state_size >= 8 * len(values)
    raw = np.array(values, np.float64).tobytes()
    ctypes.memmove(env._state, raw, len(raw))


def near(rng, centre, spread, dtype):
    """centre, a few ulps around it, or a random offset within spread."""
    r = rng.random()
    if r < 0.3:
        return dtype(centre)
    if r < 0.6:
        x, toward = dtype(centre), dtype(np.inf if rng.random() < 0.5 else -np.inf)
        for _ in range(int(rng.integers(1, 4))):
            x = np.nextafter(x, toward)
        return x
    return dtype(centre + rng.uniform(-spread, spread))


def test_pendulum_injected_states(lib):
    ref, env = make_pair(lib, "pendulum")
    rng = np.random.default_rng(7)
    ref.reset(seed=0)
    env.reset(0)
    for i in range(10_000):
        th = rng.uniform(-200, 200) if i % 2 else near(rng, math.pi * rng.integers(-5, 6), 1e-6,
                                                        np.float64)
        thdot = near(rng, rng.choice([-8.0, 8.0, 0.0]), 2.0, np.float64)
        ref.state = np.array([th, thdot])
        set_c_state(env, th, thdot)
        action = np.array([near(rng, rng.choice([-2.0, 2.0, 0.0]), 3.0, f32)], f32)
        w = ref.step(action)
        assert_step_equal(env.step(action), w[:4], (i, th, thdot, action))


def mountain_car_state(rng):
    position = near(rng, rng.choice([-1.2, 0.6, 0.5, 0.45, -0.5]), 0.1, np.float64)
    velocity = near(rng, rng.choice([-0.07, 0.07, 0.0, 0.01]), 0.02, np.float64)
    return position, velocity


@pytest.mark.parametrize("goal_velocity", [0.0, 0.01])
def test_mountain_car_injected_states(lib, goal_velocity):
    ref, env = make_pair(lib, "mountain_car", {"goal_velocity": goal_velocity})
    rng = np.random.default_rng(8)
    ref.reset(seed=0)
    env.reset(0)
    for i in range(10_000):
        position, velocity = mountain_car_state(rng)
        ref.state = np.array([position, velocity])
        set_c_state(env, position, velocity)
        action = np.int64(rng.integers(0, 3))
        w = ref.step(action)
        assert_step_equal(env.step(action), w[:4], (i, position, velocity, action))


def continuous_action(rng):
    centre = rng.choice([-1.0, 1.0, 0.0, 3.0, -3.0])
    return np.array([near(rng, centre, 1.5, f32)], f32)


@pytest.mark.parametrize("state_dtype", [np.float64, np.float32])
@pytest.mark.parametrize("goal_velocity", [0.0, 0.01, 0.07])
def test_mountain_car_continuous_injected_states(lib, state_dtype, goal_velocity):
    """float64 state = the first step after a reset; float32 = later steps."""
    ref, env = make_pair(lib, "mountain_car_continuous", {"goal_velocity": goal_velocity})
    rng = np.random.default_rng(9)
    ref.reset(seed=0)
    env.reset(0)
    for i in range(10_000):
        ref.reset()  # continues both RNGs
        env.reset()
        if state_dtype is np.float32:  # one step makes both hold a float32 state
            action = continuous_action(rng)
            ref.step(action)
            env.step(action)
        position, velocity = (state_dtype(x) for x in mountain_car_state(rng))
        ref.state = np.array([position, velocity], dtype=state_dtype)
        set_c_state(env, float(position), float(velocity))
        for j in range(3):
            action = continuous_action(rng)
            w = ref.step(action)
            assert_step_equal(env.step(action), w[:4], (i, j, position, velocity, action))


# Constructed float32 states where comparing in float32 (NEP 50: the Python
# float is cast to float32) and comparing in double give different results.
F32_PI_6 = f32(math.pi / 6)  # cos(3 * position) ~ 0: velocity + force 0 stays put


def wall_landing(v0):
    """A float32 position from which velocity v0 and action 0 land exactly on
    float32(-1.2), found with gymnasium's own expressions."""
    wall = f32(-1.2)

    def v_new(p):
        return v0 + (f32(0.0) * 0.0015 - 0.0025 * math.cos(3 * p))

    p = wall
    for _ in range(8):
        p = f32(wall - v_new(p))
    for p0 in (p, *(np.nextafter(p, f32(d)) for d in (np.inf, -np.inf))):
        if p0 + v_new(p0) == wall and v_new(p0) < 0:
            return p0
    raise AssertionError("no landing position found")


@pytest.mark.parametrize("goal_velocity,position,velocity,want_obs,want_term", [
    # float32(0.07) is not > 0.07 in float32, so no clamp to the double 0.07, and
    # float32(0.07) >= float32(0.0700000004): terminated (not in double).
    (0.0700000004, F32_PI_6, f32(0.07), None, True),
    # The same below: float32(-0.07) is not < -0.07, and is >= float32(-0.0699999999).
    (-0.0699999999, F32_PI_6, f32(-0.07), None, True),
    # Landing on float32(-1.2): not < -1.2 but == -1.2 in float32, so velocity = 0.
    (0.0, wall_landing(f32(-0.01)), f32(-0.01), [f32(-1.2), f32(0)], False),
    (0.0, wall_landing(f32(-0.05)), f32(-0.05), [f32(-1.2), f32(0)], False),
])
def test_mountain_car_continuous_float32_comparisons(lib, goal_velocity, position, velocity,
                                                     want_obs, want_term):
    ref, env = make_pair(lib, "mountain_car_continuous", {"goal_velocity": goal_velocity})
    action = np.array([0.0], f32)
    ref.reset(seed=0)
    env.reset(0)
    ref.step(action)  # both now hold a float32 state
    env.step(action)
    ref.state = np.array([position, velocity], f32)
    set_c_state(env, float(position), float(velocity))
    w = ref.step(action)
    assert w[2] is want_term
    if want_obs is not None:
        assert w[0].tobytes() == np.array(want_obs, f32).tobytes()
    assert_step_equal(env.step(action), w[:4], (goal_velocity, position, velocity))


# ---- special actions and the types that make MountainCarContinuous tricky -----
SPECIAL = [np.inf, -np.inf, np.nan, -0.0, 0.0, 1.0, -1.0, 2.0, -2.0, 1e30, -1e30, 1e-45,
           float(np.nextafter(f32(1), f32(2))), float(np.nextafter(f32(-1), f32(-2))),
           float(np.nextafter(f32(2), f32(3))), float(np.nextafter(f32(-2), f32(-3)))]


@pytest.mark.parametrize("key", ["pendulum", "mountain_car_continuous"])
def test_special_actions(lib, key):
    ref, env = make_pair(lib, key)
    for k, value in enumerate(SPECIAL):
        ref.reset(seed=k)
        env.reset(k)
        for t in range(3):  # special on the first (float64 state) and later steps
            action = np.array([value if t != 1 else 0.25], f32)
            obs, reward, term, _ = env.step(action)
            w_obs, w_reward, w_term, _, _ = ref.step(action)
            np.testing.assert_array_equal(obs, w_obs)  # NaN-aware
            assert (reward == w_reward) or (math.isnan(reward) and math.isnan(w_reward))
            assert term == w_term


def test_mountain_car_rejects_invalid_action(lib):
    _, env = make_pair(lib, "mountain_car")
    env.reset(0)
    reward, term, trunc = ctypes.c_double(), ctypes.c_bool(), ctypes.c_bool()
    for bad in (-1, 3):
        action = ctypes.c_int64(bad)
        rc = env.define.step(env._state, ctypes.byref(env.rng), ctypes.addressof(action),
                             env.obs.ctypes.data, ctypes.byref(reward), ctypes.byref(term),
                             ctypes.byref(trunc))
        assert rc == -1  # ENVD_EINVAL, where gymnasium's step asserts


def test_numpy_rules_the_envs_rely_on():
    """The NEP 50 and libm facts the C code is written against."""
    x32 = f32(0.3)
    assert type(x32 - 0.1) is np.float32 and x32 - 0.1 == x32 - f32(0.1)
    assert type(x32 + np.float64(0.1)) is np.float64
    assert type(3 * x32) is np.float32
    assert f32(0.45) >= 0.45 and not f32(0.1) > 0.1  # comparisons in float32
    assert type(max(x32, -1.0)) is np.float32 and type(max(f32(-2), -1.0)) is float
    assert type(np.clip(np.array([5.0], f32), -2.0, 2.0)[0]) is np.float32
    # float64 ** 2 is libm pow, not x*x, and float32 ** 2 is powf: find where
    # they differ from the correctly rounded square to show the difference matters.
    xs = np.random.default_rng(0).uniform(-10, 10, 20_000)
    assert any(np.float64(x) ** 2 != x * x for x in xs)
    xs32 = xs.astype(f32)
    assert any(x ** 2 != f32(float(x) * float(x)) for x in xs32)
