"""An env's terminated and truncated flags as the worker takes them
(native/hosted_worker.py, _flag): the truth of a scalar, decided once, so
that the worker's SAME_STEP reset and the byte the parent reads agree; a
flag of any other type (a list, an array, a string, an object whose
``__bool__`` raises) is that env's error, never the worker's death."""
from __future__ import annotations

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces

import envd


class RaisingBool:
    def __bool__(self):
        raise RuntimeError("no truth here")


#: name -> (terminated, truncated) an env reset with seed 0 returns from its
#: second step on (its flag named in the error)
ODD_FLAGS = {
    "list": (([0], False), "terminated", "list"),  # true to Python, False once stored
    "array": ((False, np.array([1])), "truncated", "ndarray"),
    "string": (("yes", False), "terminated", "str"),
    # (terminated true: the truncated flag's truth was first asked by numpy's store)
    "raising": ((True, RaisingBool()), "truncated", "RaisingBool"),
}


class OddFlagEnv(gymnasium.Env):
    """Counts its steps; reset with seed 0, its second step returns the odd
    flags named by its kind (others never end)."""
    observation_space = spaces.Box(-1e9, 1e9, (1,), np.float64)
    action_space = spaces.Discrete(2)

    def __init__(self, kind: str):
        self.kind = kind
        self.odd = False
        self.t = 0

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.odd = seed == 0
        self.t = 0
        return np.array([0.0]), {}

    def step(self, action):
        self.t += 1
        term, trunc = ODD_FLAGS[self.kind][0] if self.odd and self.t >= 2 else (False, False)
        return np.array([float(self.t)]), 1.0, term, trunc, {}


@pytest.mark.parametrize("num_workers", [0, 1, 2])
@pytest.mark.parametrize("kind", sorted(ODD_FLAGS))
def test_an_odd_flag_is_the_envs_error(kind, num_workers):
    _, name, type_name = ODD_FLAGS[kind]
    with envd.make(lambda: OddFlagEnv(kind), 2, num_workers=num_workers,
                   autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP) as env:
        env.reset(seed=0)
        env.step(np.zeros(2, np.int64))
        with pytest.raises(envd.EnvError) as raised:
            env.step(np.zeros(2, np.int64))
        assert raised.value.env_index == 0
        assert (f"env 0 raised TypeError: its {name} flag is a {type_name}, not a bool"
                in str(raised.value))
        # the worker and the other env live on: a reset (env 0 seeded 5: no odd flags)
        # and steps as any env's
        env.reset(seed=5)
        for t in range(1, 4):
            obs, reward, term, trunc, _ = env.step(np.zeros(2, np.int64))
            assert (obs[:, 0] == t).all() and (reward == 1.0).all()
            assert not term.any() and not trunc.any()


class ScalarFlagEnv(gymnasium.Env):
    """Ends its episode at its third step with numpy and int flags."""
    observation_space = spaces.Box(-1e9, 1e9, (1,), np.float64)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return np.array([0.0]), {}

    def step(self, action):
        self.t += 1
        return np.array([float(self.t)]), 1.0, np.bool_(self.t == 3), 0, {}


@pytest.mark.parametrize("num_workers", [0, 1])
def test_scalar_flags_decide_the_same_step_reset(num_workers):
    with envd.make(ScalarFlagEnv, 2, num_workers=num_workers,
                   autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP) as env:
        env.reset(seed=0)
        for t in (1, 2):
            obs, _, term, _, _ = env.step(np.zeros(2, np.int64))
            assert (obs[:, 0] == t).all() and not term.any()
        obs, _, term, trunc, _ = env.step(np.zeros(2, np.int64))
        assert term.all() and not trunc.any()
        assert (obs[:, 0] == 0.0).all()  # reset at once
        obs, _, term, _, _ = env.step(np.zeros(2, np.int64))
        assert (obs[:, 0] == 1.0).all() and not term.any()
