"""puffer:<env> through envd.make: the native pool steps PufferLib's envs.

Env i of envd.make("puffer:<env>", N, seed=s, num_threads=t) must equal
PufferLib's own binding with one env seeded s + i (the reference of
puffer_reference.py), whatever t; the env resets itself (no autoreset, no
time limit, truncations always False) and reports its own episodes.
"""
from __future__ import annotations

import numpy as np
import ocean_cases
import plugin_driver
import puffer_reference
import pytest

import envd

N = 3
STEPS = 400


@pytest.fixture
def ocean_cache(ocean_builds, monkeypatch):
    """The tests' cache as the user's Ocean cache, holding the builds."""
    for env in ocean_cases.ALL:
        ocean_builds(env)
    monkeypatch.setenv("ENVD_OCEAN_CACHE", str(puffer_reference.test_cache()))
    return puffer_reference.test_cache()


def _rows_actions(desc, rng, steps):
    """steps x (N * agents) actions in envd's layout, and per env the
    driver's layout (steps x agents x k) for the reference."""
    per_env = [ocean_cases.random_actions(desc, steps, rng) for _ in range(N)]
    stacked = np.concatenate(per_env, axis=1)  # steps x (N*agents) x k
    act = desc["act"]
    if act["kind"] == 1:
        rows = stacked[..., 0].astype(np.int64)
    elif act["kind"] == 2:
        rows = stacked.astype(np.int64)
    else:
        rows = stacked.astype(np.float32).reshape(steps, -1, *act["shape"])
    return rows, per_env


def _reference(env, plugin, kwargs, seed, actions, desc):
    act_dtype = ocean_cases.ALL[env][2]
    clipped = np.clip(actions, -1, 1) if desc["act"]["kind"] == 0 else actions
    return puffer_reference.reference_trajectory(
        puffer_reference.reference_binding(env), plugin.ckwargs(**kwargs), seed, clipped,
        desc["agents"], desc["obs"]["shape"], desc["obs"]["dtype"], act_dtype)


@pytest.mark.parametrize("threads", [0, 1, 2])
@pytest.mark.parametrize("env", sorted(ocean_cases.EXACT))
def test_make_equals_pufferlib_per_env(env, threads, ocean_cache, ocean_builds):
    _, kwargs, _ = ocean_cases.EXACT[env]
    plugin = plugin_driver.Plugin(ocean_builds(env))
    desc = plugin.describe(**kwargs)
    agents = desc["agents"]
    rows, per_env = _rows_actions(desc, np.random.default_rng(threads), STEPS)
    vec = envd.make(f"puffer:{env}", N, seed=7, num_threads=threads, **kwargs)
    try:
        if threads:
            # on the pool with chunks of one env (N envs are too few to leave
            # the caller otherwise): each env on whichever thread claims it
            # first, in no fixed order
            vec.set_chunk_size(1)
        assert vec.num_envs == N * agents
        obs, _ = vec.reset()
        got_obs, got_rew, got_term = [obs.copy()], [], []
        for step in range(STEPS):
            obs, rew, term, trunc, info = vec.step(rows[step])
            assert not trunc.any()
            got_obs.append(obs.copy())
            got_rew.append(rew.copy())
            got_term.append(term.copy())
    finally:
        vec.close()
    got_obs, got_rew, got_term = map(np.stack, (got_obs, got_rew, got_term))
    for i in range(N):
        ref = _reference(env, plugin, kwargs, 7 + i, per_env[i], desc)
        rows_i = slice(i * agents, (i + 1) * agents)
        assert got_obs[:, rows_i].tobytes() == ref["obs"].tobytes(), f"env {i}"
        np.testing.assert_array_equal(got_rew[:, rows_i], ref["rewards"].astype(got_rew.dtype))
        np.testing.assert_array_equal(got_term[:, rows_i], ref["terminals"])


def test_episodes_are_the_envs_own(ocean_cache):
    """breakout's Log reaches info["envd_log"] and the episode statistics."""
    vec = envd.make("puffer:breakout", 2, seed=0)
    try:
        vec.reset()
        rng = np.random.default_rng(0)
        seen = 0
        for _ in range(1500):
            _, _, _, trunc, info = vec.step(rng.integers(0, 3, size=2))
            assert not trunc.any()
            if "envd_log" in info:
                mask = info["_envd_log"]
                assert set(info["envd_log"]) >= {"score", "episode_return", "episode_length"}
                assert mask.any()
                assert (info["envd_log"]["episode_length"][mask] > 0).all()
                seen += int(mask.sum())
        assert seen > 0
    finally:
        vec.close()


def test_time_limits_and_autoreset_are_refused(ocean_cache):
    with pytest.raises(envd.EnvdError, match="autoreset_mode"):
        envd.make("puffer:pong", 1, autoreset_mode="same_step")
    with pytest.raises(envd.EnvdError, match="max_episode_steps"):
        envd.make("puffer:pong", 1, max_episode_steps=10)


def test_unknown_or_unbuilt_ocean_envs(ocean_cache, tmp_path, monkeypatch):
    with pytest.raises(envd.UnknownEnvError, match="envd builds the Ocean envs breakout"):
        envd.make("puffer:nosuch", 1)
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o700)
    monkeypatch.setenv("ENVD_OCEAN_CACHE", str(empty))
    with pytest.raises(envd.UnknownEnvError, match=r"envd ocean build moba|no build of"):
        envd.make("puffer:moba", 1)
    with pytest.raises(envd.InvalidArgumentError, match="grid_size"):
        envd.make("puffer:go", 1, grid_size=99)


@pytest.mark.parametrize("threads", [0, 2])
def test_terraform_rows_are_reproducible(threads, ocean_cache):
    """terraform (2 dozers per env as rows) gives one trajectory per seed,
    whatever the threads."""
    def run(num_threads):
        vec = envd.make("puffer:terraform", 2, seed=3, num_threads=num_threads, num_agents=2)
        try:
            assert vec.num_envs == 4
            obs = [vec.reset()[0].copy()]
            rng = np.random.default_rng(0)
            for _ in range(200):
                obs.append(vec.step(rng.integers(0, [5, 5, 3], size=(4, 3)))[0].copy())
            return np.stack(obs)
        finally:
            vec.close()

    assert run(threads).tobytes() == run(1).tobytes()
