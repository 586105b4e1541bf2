"""simple_spread_v3 (native/src/envs/simple_spread.c) against mpe2's parallel API, bit for bit.

The C definitions are driven directly (no vec layer): one instance steps its
three agents at once, as ABI 4's multi-agent callbacks do (N observations,
actions, rewards and flags per call, agent 0 first).  The reference is
``mpe2.simple_spread_v3.parallel_env`` stepped with the same actions;
observations (float32), rewards (float64, before envd rounds them to float32),
terminations and truncations must be equal, over several episodes that
continue one RNG stream (``reset()`` without a seed, as envd's autoreset does).
"""
import ctypes
import warnings

import cbuild
import numpy as np
import pytest

mpe2_spread = pytest.importorskip("mpe2.simple_spread_v3", reason="mpe2 is the reference")

N = 3
OBS_DIM = 6 * N
SYMBOLS = {False: "envd_builtin_simple_spread", True: "envd_builtin_simple_spread_continuous"}


@pytest.fixture(scope="module")
def lib():
    return cbuild.load(["rng.c", "raster.c", "envs/simple_spread.c"])


class SpreadEnv:
    """One instance of a simple_spread definition, its N agents stepped together."""

    def __init__(self, lib: ctypes.CDLL, continuous: bool, local_ratio: float = 0.5,
                 max_cycles: int = 25):
        self.lib = lib
        self.define = d = cbuild.EnvDef.in_dll(lib, SYMBOLS[continuous])
        self._params = (ctypes.c_double * 2)(local_ratio, max_cycles)
        self._state = ctypes.create_string_buffer(d.state_size)
        self.rng = cbuild.Rng()
        self.obs = np.zeros((N, OBS_DIM), np.float32)
        self.action = np.zeros((N, 5), np.float32) if continuous else np.zeros(N, np.int64)
        self.reward = np.zeros(N, np.float64)
        self.term = np.zeros(N, np.bool_)
        self.trunc = np.zeros(N, np.bool_)
        lib.envd_rng_seed.argtypes = [ctypes.POINTER(cbuild.Rng), ctypes.c_uint64]
        assert d.init(self._state, self._params) == 0

    def reset(self, seed: int | None = None) -> np.ndarray:
        if seed is not None:
            self.lib.envd_rng_seed(ctypes.byref(self.rng), seed)
        assert self.define.reset(self._state, ctypes.byref(self.rng), self.obs.ctypes.data) == 0
        return self.obs.copy()

    def step(self, actions: np.ndarray):
        self.action[...] = actions
        ptr = ctypes.POINTER(ctypes.c_double)
        bptr = ctypes.POINTER(ctypes.c_bool)
        rc = self.define.step(self._state, ctypes.byref(self.rng), self.action.ctypes.data,
                              self.obs.ctypes.data, self.reward.ctypes.data_as(ptr),
                              self.term.ctypes.data_as(bptr), self.trunc.ctypes.data_as(bptr))
        assert rc == 0
        return self.obs.copy(), self.reward.copy(), self.term.copy(), self.trunc.copy()


def reference(continuous: bool, local_ratio: float, max_cycles: int):
    return mpe2_spread.parallel_env(N=N, local_ratio=local_ratio, max_cycles=max_cycles,
                                    continuous_actions=continuous)


def stacked(ref, values: dict) -> np.ndarray:
    return np.array([values[a] for a in ref.possible_agents])


def random_actions(rng: np.random.Generator, continuous: bool) -> np.ndarray:
    if not continuous:
        return rng.integers(0, 5, N)
    acts = rng.random((N, 5), dtype=np.float32)
    # now and then out of [0, 1], where mpe2's ClipOutOfBoundsWrapper clips
    if rng.random() < 0.2:
        acts = acts * np.float32(2.0) - np.float32(0.5)
    return acts


def test_definitions(lib):
    for continuous, symbol in SYMBOLS.items():
        d = cbuild.EnvDef.in_dll(lib, symbol)
        ref = reference(continuous, 0.5, 25)
        agent = ref.possible_agents[0]
        assert d.abi_version == cbuild.ABI_VERSION
        assert d.num_agents == N == len(ref.possible_agents)
        assert d.id == (b"simple_spread_continuous_v3" if continuous else b"simple_spread_v3")
        obs = d.observation_space
        space = ref.observation_space(agent)
        assert (obs.kind, obs.dtype, obs.ndim, obs.shape[0]) == (0, 0, 1, OBS_DIM)
        assert space.shape == (OBS_DIM,) and space.dtype == np.float32
        assert not obs.low and not obs.high and np.all(np.isinf(space.high))
        act = d.action_space
        ref_act = ref.action_space(agent)
        if continuous:
            assert (act.kind, act.dtype, act.ndim, act.shape[0]) == (0, 0, 1, 5)
            assert np.array_equal(np.ctypeslib.as_array(act.low, (5,)), ref_act.low)
            assert np.array_equal(np.ctypeslib.as_array(act.high, (5,)), ref_act.high)
            assert ref_act.dtype == np.float32
        else:
            assert (act.kind, act.dtype, act.n, act.start) == (1, 2, 5, 0)
            assert ref_act.n == 5 and ref_act.start == 0
        names = [d.params[i].name for i in range(d.num_params)]
        assert names == [b"local_ratio", b"max_cycles"]
        assert [d.params[i].default_value for i in range(2)] == [0.5, 25.0]
        ref.close()


@pytest.mark.parametrize("continuous", [False, True], ids=["discrete", "continuous"])
@pytest.mark.parametrize("seed,local_ratio,max_cycles", [
    (0, 0.5, 25), (1, 0.0, 25), (7, 1.0, 10), (123, 0.25, 40), (2**31 + 5, 0.75, 1),
])
def test_matches_mpe2(lib, continuous, seed, local_ratio, max_cycles):
    env = SpreadEnv(lib, continuous, local_ratio, max_cycles)
    ref = reference(continuous, local_ratio, max_cycles)
    act_rng = np.random.default_rng(seed + 1000)
    collisions = 0
    episodes = max(3, 150 // max_cycles)
    for episode in range(episodes):
        # the first reset seeds; the next ones continue the stream, as autoreset does
        ref_obs, _ = ref.reset(seed=seed if episode == 0 else None)
        obs = env.reset(seed if episode == 0 else None)
        assert obs.tobytes() == stacked(ref, ref_obs).tobytes(), (episode, obs, ref_obs)
        for t in range(max_cycles):
            actions = random_actions(act_rng, continuous)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # mpe2's out-of-bounds warnings
                r_obs, r_rew, r_term, r_trunc, _ = ref.step(
                    {a: actions[i] for i, a in enumerate(ref.possible_agents)})
            obs, rew, term, trunc = env.step(actions)
            where = (episode, t)
            assert obs.tobytes() == stacked(ref, r_obs).tobytes(), (where, obs, r_obs)
            ref_rew = stacked(ref, r_rew).astype(np.float64)
            assert rew.tobytes() == ref_rew.tobytes(), (where, rew, ref_rew)
            assert np.array_equal(term, stacked(ref, r_term)), where
            assert np.array_equal(trunc, stacked(ref, r_trunc)), where
            assert trunc.all() == (t == max_cycles - 1), where
            collisions += local_ratio > 0 and len(set(rew.tolist())) > 1
    ref.close()
    if local_ratio > 0 and max_cycles > 1:
        # the collision penalty (and with it the contact forces) was exercised
        assert collisions > 0


def test_contact_forces_push_overlapping_agents_apart(lib):
    """Two agents reset on top of each other (a state the seeds above rarely
    reach for long) repel, exactly as mpe2's soft contact computes it."""
    for seed in range(200):
        env = SpreadEnv(lib, False)
        ref = reference(False, 0.5, 25)
        ref_obs, _ = ref.reset(seed=seed)
        obs = env.reset(seed)
        # the nearest pair of agents at reset, from the observations' positions
        pos = obs[:, 2:4].astype(np.float64)
        dists = [np.hypot(*(pos[i] - pos[j])) for i in range(N) for j in range(i + 1, N)]
        if min(dists) < 0.3:
            break
        ref.close()
    else:
        pytest.fail("no seed in 0..199 starts with two agents in contact")
    for t in range(5):
        r_obs, r_rew, _, _, _ = ref.step(dict.fromkeys(ref.possible_agents, 0))  # no_action
        obs, rew, _, _ = env.step(np.zeros(N, np.int64))
        assert obs.tobytes() == stacked(ref, r_obs).tobytes(), (t, obs, r_obs)
        assert rew.tobytes() == stacked(ref, r_rew).astype(np.float64).tobytes()
    # no action was taken, so any velocity is the contact force's
    assert np.any(obs[:, 0:2] != 0)
    ref.close()


def different_fraction(frame: np.ndarray, reference: np.ndarray, levels: int = 32) -> float:
    diff = np.abs(frame.astype(np.int16) - reference.astype(np.int16)).max(axis=2)
    return float(np.mean(diff > levels))


def test_frames_look_like_mpe2(lib):
    """render draws mpe2's picture (discs on white, the camera following the
    entities) closely, though not bit for bit (pygame rounds its circles its
    own way); a frame of another state does not pass the same comparison."""
    env = SpreadEnv(lib, False)
    d = env.define
    assert (d.render_width, d.render_height, d.render_fps) == (700, 700, 10)
    ref = mpe2_spread.parallel_env(N=N, render_mode="rgb_array")
    ref.reset(seed=3)
    env.reset(3)
    frame = np.zeros((700, 700, 3), np.uint8)
    frames = []
    for t, action in enumerate([4, 4, 1, 2, 0, 3, 3, 3]):
        assert d.render(env._state, frame.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))) == 0
        reference_frame = ref.render()
        assert reference_frame.shape == frame.shape
        assert different_fraction(frame, reference_frame) < 0.01, t
        # something is drawn: agent blue and landmark grey
        assert np.any(np.all(frame == (70, 70, 170), axis=2))
        assert np.any(np.all(frame == (50, 50, 50), axis=2))
        frames.append(frame.copy())
        ref.step(dict.fromkeys(ref.possible_agents, action))
        env.step(np.full(N, action, np.int64))
    assert different_fraction(frames[0], frames[-1]) > 0.01  # the comparison can fail
    ref.close()
