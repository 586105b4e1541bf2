"""Hosted PettingZoo envs beyond stepping: render_mode "rgb_array" (each
env's frame, its ParallelEnv's own render() drawn in the worker, compared
with mpe2's simple_spread_v3 made directly) and
call/get_attr/set_attr reaching the ParallelEnvs (one result per env, not
per row), in-process with 0 and 2 workers."""
from __future__ import annotations

import numpy as np
import pytest

import envd
from envd.errors import EnvError, EnvStateError, InvalidArgumentError

mpe2_spread = pytest.importorskip("mpe2.simple_spread_v3", reason="mpe2 is the reference")

SPREAD_ID = "pz:mpe2.simple_spread_v3:parallel_env"
WORKERS = [0, 2]


@pytest.mark.parametrize("num_workers", WORKERS)
def test_rgb_array_frames_equal_the_parallel_envs_own(num_workers):
    n, seed = 2, 7
    env = envd.make(SPREAD_ID, n, num_workers=num_workers, seed=seed, render_mode="rgb_array",
                    max_cycles=30)
    refs = [mpe2_spread.parallel_env(render_mode="rgb_array", max_cycles=30) for _ in range(n)]
    try:
        assert env.render_mode == "rgb_array"
        assert env.metadata["render_fps"] == refs[0].metadata["render_fps"]
        assert "rgb_array" in env.metadata["render_modes"]
        env.reset()
        for i, ref in enumerate(refs):
            ref.reset(seed=seed + i)  # (envd seeds env i with seed + i)
        a = env.num_agents_per_env
        rng = np.random.default_rng(0)
        for _ in range(6):
            frames = env.render()
            assert type(frames) is tuple and len(frames) == n  # one per env, not per row
            for frame, ref in zip(frames, refs):
                want = ref.render()
                assert frame.dtype == np.uint8 and frame.shape == want.shape
                np.testing.assert_array_equal(frame, want)
            assert not np.array_equal(frames[0], frames[1])  # (two envs, two seeds)
            actions = rng.integers(0, 5, env.num_envs)
            env.step(actions)
            for i, ref in enumerate(refs):
                ref.step({agent: int(actions[i * a + k])
                          for k, agent in enumerate(ref.possible_agents)})
    finally:
        env.close()
        for ref in refs:
            ref.close()


def test_render_without_render_mode_is_refused():
    with envd.make(SPREAD_ID, 1, num_workers=0) as env:
        assert env.render_mode is None
        env.reset(seed=0)
        with pytest.raises(EnvStateError, match="render_mode='rgb_array'"):
            env.render()


def test_render_mode_an_env_cannot_take_is_refused_at_make():
    # a factory without a render_mode parameter, and a creator's env made without one
    with pytest.raises(EnvError, match="unexpected keyword argument 'render_mode'"):
        envd.make("pz:pz_envs:staggered", 1, num_workers=0, render_mode="rgb_array")
    with pytest.raises(InvalidArgumentError, match="its env's render_mode is None"):
        envd.make_pettingzoo(lambda: mpe2_spread.parallel_env(), 1, num_workers=0,
                             render_mode="rgb_array")
    with pytest.raises(InvalidArgumentError, match="rgb_array"):
        envd.make(SPREAD_ID, 1, render_mode="human")


@pytest.mark.parametrize("num_workers", WORKERS)
def test_call_get_attr_set_attr_reach_the_parallel_env(num_workers):
    n = 3
    with envd.make(SPREAD_ID, n, num_workers=num_workers, seed=0, max_cycles=9) as env:
        env.reset()
        # the ParallelEnv's own attributes (the adapter has no max_cycles)
        assert env.get_attr("max_cycles") == (9,) * n
        assert env.call("max_num_agents") == (3,) * n
        assert env.get_attr("possible_agents") == (env.possible_agents,) * n
        states = env.call("state")  # (a method of the ParallelEnv, called in the workers)
        assert len(states) == n and all(
            s.shape == mpe2_spread.parallel_env().state_space.shape for s in states)
        assert not np.array_equal(states[0], states[1])  # (each env its own)
        env.set_attr("marker", [10, 11, 12])
        assert env.get_attr("marker") == (10, 11, 12)
        env.set_attr("marker", 4)
        assert env.get_attr("marker") == (4, 4, 4)
        with pytest.raises(ValueError, match="equal to the number of environments"):
            env.set_attr("marker", [1] * env.num_envs)  # (per row: refused, one per env)
        with pytest.raises(AttributeError):
            env.get_attr("no_such_attribute")
        with pytest.raises(ValueError, match="use `step` directly"):
            env.call("step", {})
        # stepping goes on after the calls
        obs, *_ = env.step(np.zeros(env.num_envs, np.int64))
        assert obs.shape == (env.num_envs, *env.single_observation_space.shape)
