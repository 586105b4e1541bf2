"""An independent Python reference of tests/native/multi_spaces.c (Lights-v0
and Switches-v0: MultiDiscrete and MultiBinary spaces, a per-env kwarg) and
the checks run against it, in-process (in a fresh interpreter: a loaded
plugin stays in the registry) and through the daemon.

The reference is written from the plugin's header comment, not from its
output: next_step autoreset and the time limit of 12 are modelled here.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from support.fresh_interpreter import checker

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "tests" / "native" / "multi_spaces.c"
NUM_LIGHTS = 4
TIME_LIMIT = 12


class Lights:
    """One env of Lights-v0 (switches=False) or Switches-v0 (switches=True)
    under envd's vec: time limit and next_step autoreset included."""

    def __init__(self, seed: int, bonus: float, switches: bool, same_step: bool = False):
        self.rng = np.random.default_rng(seed)  # envd seeds env i with seed + i
        self.bonus = bonus
        self.switches = switches
        self.same_step = same_step  # autoreset mode same_step, else next_step
        self.needs_reset = False
        self.final_obs: np.ndarray | None = None  # same_step: of the last step that ended

    def _obs(self) -> np.ndarray:
        if self.switches:
            return np.array([sum(self.on)], np.int64)
        return np.array(self.on, np.int8)

    def reset(self) -> np.ndarray:
        self.on = [int(self.rng.random() < 0.5) for _ in range(NUM_LIGHTS)]
        self.elapsed = 0
        self.needs_reset = False
        return self._obs()

    def step(self, action) -> tuple[np.ndarray, float, bool, bool]:
        if self.needs_reset:  # next_step autoreset: the action is ignored
            return self.reset(), 0.0, False, False
        if self.switches:
            self.on = [light ^ int(bit) for light, bit in zip(self.on, action)]
        else:
            light, how = int(action[0]), int(action[1])
            self.on[light] = 1 - self.on[light] if how == 0 else int(how > 0)
        self.elapsed += 1
        terminated = sum(self.on) == NUM_LIGHTS
        reward = sum(self.on) + (self.bonus if terminated else 0.0)
        truncated = self.elapsed >= TIME_LIMIT
        self.needs_reset = terminated or truncated
        if self.needs_reset and self.same_step:
            self.final_obs = self._obs()
            return self.reset(), reward, terminated, truncated
        return self._obs(), reward, terminated, truncated


def env_id(switches: bool) -> str:
    return "Switches-v0" if switches else "Lights-v0"


def random_actions(switches: bool, n: int, rng: np.random.Generator) -> np.ndarray:
    """Valid actions, drawn without the env's space (an independent sampler)."""
    if switches:
        return rng.integers(0, 2, size=(n, NUM_LIGHTS)).astype(np.int8)
    return np.stack([rng.integers(0, NUM_LIGHTS, n), rng.integers(-1, 2, n)], axis=1)


def compare(env, seed: int, bonus, switches: bool, steps: int = 60) -> int:
    """Step env (fresh, made with seed and bonus: a scalar or one per env)
    beside the reference; every output equal; return the episodes ended."""
    n = env.num_envs
    bonuses = np.broadcast_to(np.asarray(bonus, np.float64), (n,))
    refs = [Lights(seed + i, float(bonuses[i]), switches) for i in range(n)]
    obs, _ = env.reset()
    assert np.array_equal(obs, np.stack([r.reset() for r in refs])), obs
    rng = np.random.default_rng(seed + 1000)
    ended = 0
    for _ in range(steps):
        actions = random_actions(switches, n, rng)
        obs, rewards, terms, truncs, _ = env.step(actions)
        want = [r.step(a) for r, a in zip(refs, actions)]
        assert obs.dtype == want[0][0].dtype
        assert np.array_equal(obs, np.stack([w[0] for w in want]))
        assert rewards.tolist() == [float(np.float32(w[1])) for w in want]
        assert terms.tolist() == [w[2] for w in want]
        assert truncs.tolist() == [w[3] for w in want]
        ended += int(np.sum(terms | truncs))
    return ended


#: run multi_spaces_checks.<name>(*args) in a fresh interpreter (support/fresh_interpreter.py)
run_check = checker("multi_spaces_checks")


# ---- checks run in a fresh interpreter ------------------------------------------------

def spaces_are_gymnasium_spaces(library: str) -> None:
    from gymnasium import spaces

    import envd
    assert envd.load_plugin(library) == ["Lights-v0", "Switches-v0"]
    with envd.make("Lights-v0", 3, seed=0) as env:
        assert env.single_observation_space == spaces.MultiBinary(NUM_LIGHTS)
        assert env.single_action_space == spaces.MultiDiscrete([4, 3], start=[0, -1])
        assert env.observation_space.dtype == np.int8 and env.action_space.shape == (3, 2)
    with envd.make("Switches-v0", 3, seed=0) as env:
        assert env.single_observation_space == spaces.MultiDiscrete([5])
        assert env.single_action_space == spaces.MultiBinary(NUM_LIGHTS)


def matches_reference(library: str) -> None:
    import envd
    envd.load_plugin(library)
    for switches in (False, True):
        for threads in (0, 2):
            with envd.make(env_id(switches), 9, seed=4, num_threads=threads, bonus=2.5) as env:
                if threads:
                    env.set_chunk_size(2)  # several chunks on the pool
                assert compare(env, 4, 2.5, switches) > 9


def per_env_kwargs_match_separate_envs(library: str) -> None:
    """A list of num_envs values gives env i the i-th value: the vec steps
    like num_envs envs made one by one (seed s + i, value i), and like the
    reference."""
    import envd
    envd.load_plugin(library)
    bonuses = [0.0, 1.5, 3.0, 10.0, 7.25]
    for switches in (False, True):
        rng = np.random.default_rng(9)
        with envd.make(env_id(switches), 5, seed=11, bonus=bonuses) as vec:
            singles = [envd.make(env_id(switches), 1, seed=11 + i, bonus=b)
                       for i, b in enumerate(bonuses)]
            got = vec.reset()[0].copy()
            assert np.array_equal(got, np.concatenate([s.reset()[0] for s in singles]))
            rewarded = set()
            for _ in range(80):
                actions = random_actions(switches, 5, rng)
                got = [a.copy() for a in vec.step(actions)[:4]]
                want = [s.step(actions[i:i + 1])[:4] for i, s in enumerate(singles)]
                for k in range(4):
                    assert np.array_equal(got[k], np.concatenate([w[k] for w in want])), k
                rewarded.update(np.flatnonzero(got[2]).tolist())
            for s in singles:
                s.close()
            assert len(rewarded) >= 3, rewarded  # the bonuses were really paid
        with envd.make(env_id(switches), 5, seed=11, bonus=np.array(bonuses)) as env:
            assert compare(env, 11, bonuses, switches) > 0


def out_of_range_actions_are_refused(library: str) -> None:
    """Every element is checked (in the vec's private copy) before any env
    moves: a refused step leaves every env as it was."""
    import envd
    envd.load_plugin(library)
    bad_lights = [(0, [4, 0]), (2, [0, 2]), (1, [-1, 0]), (0, [0, -2])]
    bad_switches = [(1, [0, 0, 2, 0]), (2, [0, -1, 0, 0]), (0, [1, 1, 1, 127])]
    for switches, cases in ((False, bad_lights), (True, bad_switches)):
        with envd.make(env_id(switches), 3, seed=6, num_threads=0) as env:
            refs = [Lights(6 + i, 1.0, switches) for i in range(3)]
            obs, _ = env.reset()
            for r in refs:
                r.reset()
            rng = np.random.default_rng(2)
            for row, bad in cases:
                actions = random_actions(switches, 3, rng)
                actions[row] = bad
                try:
                    env.step(actions)
                except envd.InvalidActionError as error:
                    assert f"of env {row}" in str(error), error
                else:
                    raise AssertionError(f"{bad} was accepted")
                actions = random_actions(switches, 3, rng)  # nothing moved meanwhile
                obs = env.step(actions)[0]
                assert np.array_equal(obs, np.stack([r.step(a)[0] for r, a in zip(refs, actions)]))


def kwarg_lists_are_refused(library: str) -> None:
    import envd
    envd.load_plugin(library)
    cases = [
        ([1.0, 2.0], "has 2 values but num_envs=3"),
        ([1.0, 2.0, 3.0, 4.0], "has 4 values but num_envs=3"),
        ([1.0, 11.0, 2.0], "out of range; expected bonus (float in [0, 10], default 1.0) "
                           "(env 1 of the list)"),
        ([1.0, "x", 2.0], "must be a float, got str 'x'"),
        (np.ones((3, 1)), "must be a scalar or a 1-d list of num_envs=3 values"),
        ([], "has 0 values but num_envs=3"),
    ]
    for value, expected in cases:
        try:
            envd.make("Lights-v0", 3, seed=0, bonus=value)
        except envd.InvalidArgumentError as error:
            assert expected in str(error), (expected, str(error))
        else:
            raise AssertionError(f"bonus={value!r} was accepted")
    with envd.make("Lights-v0", 3, seed=0, bonus=np.float64(2.0)) as env:  # scalars still work
        env.reset()
