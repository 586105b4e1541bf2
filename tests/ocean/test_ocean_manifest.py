"""envd's Ocean manifests against PufferLib's own env classes.

For the defaults and two other kwarg sets per env, PufferLib's class (from
the same tree, over its reference binding) is instantiated with one env; its
spaces, agents, action buffer dtype and the C kwargs it hands its binding
must be what envd's manifest says (describe and envd_ocean_ckwargs of the
built plugin).
"""
from __future__ import annotations

import numpy as np
import ocean_cases
import plugin_driver
import puffer_reference
import pytest
from gymnasium import spaces

KWARG_SETS = {
    "breakout": [{}, {"continuous": True, "frameskip": 2}, {"brick_rows": 3, "brick_cols": 9,
                                                           "paddle_width": 40}],
    "pong": [{}, {"continuous": True}, {"max_score": 5, "frameskip": 4, "ball_max_speed_y": 9.5}],
    "go": [{}, {"grid_size": 9, "komi": 5.5}, {"grid_size": 5, "reward_move_invalid": -0.5}],
    "enduro": [{}],
    "pacman": [{}, {"randomize_starting_position": True, "frightened_time": 20},
               {"max_start_timeout": 10, "chase_mode_length": 100}],
    "snake": [{}, {"width": 40, "height": 32, "num_snakes": 4, "num_food": 40},
              {"vision": 3, "max_snake_length": 64, "leave_corpse_on_death": False,
               "num_snakes": 16, "num_food": 256,
               "width": 100, "height": 50}],
    "connect4": [{}],
    "tetris": [{}, {"n_cols": 8, "n_rows": 16}, {"deck_size": 5}],
    "terraform": [{}, {"num_agents": 2}, {"num_agents": 5, "reward_scale": 0.1,
                                          "reset_frequency": 1024}],
    "cartpole": [{}, {"continuous": True}],
    "squared": [{}, {"size": 5}, {"size": 21}],
    "tripletriad": [{}],
    "checkers": [{}, {"size": 10}, {"size": 12}],
    "target": [{}, {"num_agents": 1, "num_goals": 1}, {"num_agents": 16, "num_goals": 6}],
}
CASES = [(env, i) for env in sorted(KWARG_SETS) for i in range(len(KWARG_SETS[env]))]


class Recorder:
    """PufferLib's binding, with the kwargs its class passes remembered."""

    def __init__(self, binding):
        self._binding = binding
        self.ckwargs = []

    def __getattr__(self, name):
        return getattr(self._binding, name)

    def vec_init(self, *args, **kwargs):
        self.ckwargs.append(kwargs)
        return self._binding.vec_init(*args, **kwargs)

    def env_init(self, *args, **kwargs):
        self.ckwargs.append(kwargs)
        return self._binding.env_init(*args, **kwargs)


def _same_space(ours: dict, theirs: spaces.Space) -> None:
    if isinstance(theirs, spaces.Discrete):
        assert ours["kind"] == 1 and ours["n"] == theirs.n and theirs.start == 0
    elif isinstance(theirs, spaces.MultiDiscrete):
        assert ours["kind"] == 2 and ours["nvec"] == theirs.nvec.tolist()
    else:
        assert ours["kind"] == 0
        assert ours["shape"] == theirs.shape
        assert ours["dtype"] == theirs.dtype
        np.testing.assert_array_equal(ours["low"].reshape(theirs.shape), theirs.low)
        np.testing.assert_array_equal(ours["high"].reshape(theirs.shape), theirs.high)


@pytest.mark.parametrize("env,which", CASES)
def test_manifest_equals_the_pufferlib_class(env, which, ocean_builds):
    class_name, _, act_dtype = ocean_cases.ALL[env]
    kwargs = KWARG_SETS[env][which]
    recorder = Recorder(puffer_reference.reference_binding(env))
    cls = puffer_reference.puffer_class(env, class_name, binding=recorder)
    instance = cls(num_envs=1, **kwargs)
    try:
        plugin = plugin_driver.Plugin(ocean_builds(env))
        desc = plugin.describe(**kwargs)
        _same_space(desc["obs"], instance.single_observation_space)
        _same_space(desc["act"], instance.single_action_space)
        assert desc["agents"] == instance.num_agents
        assert instance.actions.dtype == act_dtype
        assert len(recorder.ckwargs) == 1
        theirs = {k: float(v) for k, v in recorder.ckwargs[0].items()}
        assert plugin.ckwargs(**kwargs) == theirs
    finally:
        instance.close()


@pytest.mark.parametrize("env", sorted(KWARG_SETS))
def test_params_are_the_class_kwargs(env, ocean_builds):
    """Every make kwarg is a kwarg of the class, with the class's default."""
    import inspect
    class_name = ocean_cases.ALL[env][0]
    cls = puffer_reference.puffer_class(env, class_name)
    defaults = {k: p.default for k, p in inspect.signature(cls).parameters.items()}
    plugin = plugin_driver.Plugin(ocean_builds(env))
    for name, (_, default, low, high) in plugin.params.items():
        assert name in defaults, name
        assert float(defaults[name]) == default, name
        assert low <= default <= high
