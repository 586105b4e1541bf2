"""envd's Ocean envs against PufferLib's own binding, bit for bit.

Env i of envd seeded s must equal PufferLib's binding.c built by PufferLib's
own env_binding.h (tests/ocean/puffer_reference.py) with one env:
vec_init(..., 1, s, **ckwargs), vec_reset(h, s), vec_step.  The plugin is
driven through its ABI 5 callbacks (plugin_driver.py), as envd's host does;
episode logs are compared with the reference's vec_log after every step.
"""
from __future__ import annotations

import threading

import numpy as np
import ocean_cases
import plugin_driver
import puffer_reference
import pytest

SEEDS = (0, 1, 7)
STEPS = 3000
STEPS_REPRODUCIBLE = 1000


def _envd_run(plugin, seed, kwargs, actions, bind=False, scribble=False):
    inst = plugin_driver.Instance(plugin, seed, bind=bind, scribble=scribble, **kwargs)
    obs, rews, terms, logs = [inst.reset()], [], [], []
    try:
        for a in actions:
            o, r, t, tr, ended, log = inst.step(a.astype(np.float32 if a.dtype.kind == "f" else np.int64))
            assert not tr.any()
            obs.append(o)
            rews.append(r)
            terms.append(t)
            logs.append((ended, log))
    finally:
        inst.close()
    return np.stack(obs), np.stack(rews), np.stack(terms), logs


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("env", sorted(ocean_cases.EXACT))
def test_trajectory_equals_pufferlib(env, seed, ocean_builds):
    _, kwargs, act_dtype = ocean_cases.EXACT[env]
    _check_exact(ocean_builds(env), env, kwargs, seed, act_dtype)


@pytest.mark.parametrize("env,kwargs", [("breakout", {"continuous": True}),
                                        ("pong", {"continuous": True, "max_score": 3}),
                                        ("cartpole", {"continuous": True})])
def test_continuous_trajectory_equals_pufferlib(env, kwargs, ocean_builds):
    """Box actions, 50% beyond their bounds: clipped as PufferLib's class clips."""
    _check_exact(ocean_builds(env), env, kwargs, 1, np.float32)


@pytest.mark.parametrize("env", sorted(ocean_cases.ALL))
def test_envs_writing_their_rows_are_the_audited_ones(env, ocean_builds):
    """ENVD_ENV_OBS_ROWS only where docs/ocean.md audited the env's code, and
    ENVD_ENV_OBS_ROWS_PRIVATE exactly where it reads its observations back."""
    flags = plugin_driver.Plugin(ocean_builds(env)).d.flags
    assert bool(flags & plugin_driver.OBS_ROWS) == (env in ocean_cases.OBS_ROWS)
    assert bool(flags & plugin_driver.OBS_ROWS_PRIVATE) == ocean_cases.OBS_ROWS.get(env, False)


@pytest.mark.parametrize("env", sorted(ocean_cases.OBS_ROWS))
def test_envs_bound_to_their_rows_equal_pufferlib(env, ocean_builds):
    """Bound to its row (bind_obs), the env writes it directly: the same
    trajectory as PufferLib's, bit for bit (an env PufferLib cannot
    reproduce: as the same env copying its rows)."""
    _check_bound(ocean_builds(env), env, 7)


# (junk in checkers' rows can hang it: test_checkers_reads_its_rows_back)
@pytest.mark.parametrize("env", sorted(set(ocean_cases.OBS_ROWS) - {"checkers"}))
def test_rows_written_by_a_client_change_only_envs_that_read_them(env, ocean_builds):
    """A client may write its rows in a daemon's shared memory.  An env bound
    there that never reads them back steps as PufferLib's whatever was
    written (its rewards, terminals and episode logs; its observations are
    its own wherever it writes them); squared reads them back, which changes
    its trajectory: it is bound only in-process."""
    if ocean_cases.OBS_ROWS[env]:
        with pytest.raises(AssertionError):
            _check_bound(ocean_builds(env), env, 1, scribble=True)
    else:
        _check_bound(ocean_builds(env), env, 1, scribble=True)


def test_checkers_reads_its_rows_back(ocean_builds):
    """checkers' board is its observation: a pawn taken out of its bound row
    is gone for the env, so moving it is illegal and the step differs.  It is
    bound only in-process: junk in its rows can even hang its opponent's
    move search (scripted_random_move looks for one of its pieces until it
    finds one)."""
    plugin = plugin_driver.Plugin(ocean_builds("checkers"))
    size = 8
    move = (2 * size + 1) * 8 + 3  # the agent's pawn at (2, 1) to (3, 2)
    rewards = []
    for tamper in (False, True):
        inst = plugin_driver.Instance(plugin, 3, bind=True, size=size)
        try:
            obs = inst.reset()
            assert obs[0, 2 * size + 1] != 0 and obs[0, 3 * size + 2] == 0
            if tamper:
                inst.obs[0, 2 * size + 1] = 0  # EMPTY
            rewards.append(inst.step(np.array([move], dtype=np.int64))[1][0])
        finally:
            inst.close()
    # untouched: the opponent's reply leaves reward 0; tampered: the move is
    # illegal, it stays the agent's turn and the scripted move plays for it
    assert rewards[0] != rewards[1]


def _check_bound(library, env, seed, scribble=False):
    """The env bound to its rows against PufferLib's (EXACT envs) or against
    itself copying its rows (REPRODUCIBLE ones, STEPS_REPRODUCIBLE steps)."""
    _, kwargs, act_dtype = ocean_cases.ALL[env]
    if env in ocean_cases.EXACT:
        _check_exact(library, env, kwargs, seed, act_dtype, bind=True, scribble=scribble)
        return
    # terraform ends its episodes every reset_frequency ticks (8192 by default)
    kwargs = {**kwargs, "reset_frequency": 250} if env == "terraform" else kwargs
    plugin = plugin_driver.Plugin(library)
    desc = plugin.describe(**kwargs)
    actions = ocean_cases.random_actions(desc, STEPS_REPRODUCIBLE,
                                         np.random.default_rng(seed + 100))
    obs, rews, terms, logs = _envd_run(plugin, seed, kwargs, actions)
    b_obs, b_rews, b_terms, b_logs = _envd_run(plugin, seed, kwargs, actions, True, scribble)
    if not scribble:  # (a row the env leaves unwritten in a step keeps the junk)
        assert b_obs.tobytes() == obs.tobytes()
    assert b_rews.tobytes() == rews.tobytes()
    assert b_terms.tobytes() == terms.tobytes()
    assert b_logs == logs
    # (random moves in checkers are nearly all illegal: no game ends)
    if env != "checkers":
        assert any(n for n, _ in logs), "no episode ended: the logs were not compared"


def _check_exact(library, env, kwargs, seed, act_dtype, bind=False, scribble=False):
    plugin = plugin_driver.Plugin(library)
    desc = plugin.describe(**kwargs)
    actions = ocean_cases.random_actions(desc, STEPS, np.random.default_rng(seed + 100))
    obs, rews, terms, logs = _envd_run(plugin, seed, kwargs, actions, bind, scribble)

    # PufferLib's vec_log (the mean of the Log since its last call) is read
    # where envd reported episodes: it must hold exactly those (its n) with the
    # same means, and nothing must be left at the end.
    binding = puffer_reference.reference_binding(env)
    ref_logs = {}
    step = iter(range(STEPS))

    def after_step(handle):
        k = next(step)
        if logs[k][0]:
            ref_logs[k] = binding.vec_log(handle)
        elif k == STEPS - 1:
            ref_logs["left"] = binding.vec_log(handle)

    clipped = np.clip(actions, -1, 1) if desc["act"]["kind"] == 0 else actions
    ref = puffer_reference.reference_trajectory(
        binding, plugin.ckwargs(**kwargs), seed, clipped, desc["agents"], desc["obs"]["shape"],
        desc["obs"]["dtype"], act_dtype, after_step=after_step)
    if not scribble:  # (a row the env leaves unwritten in a step keeps the junk)
        assert obs.tobytes() == ref["obs"].tobytes()
    np.testing.assert_array_equal(rews, ref["rewards"].astype(np.float64))
    np.testing.assert_array_equal(terms, ref["terminals"])
    assert "n" not in ref_logs.get("left", {}), "PufferLib logged episodes envd did not report"
    ended = [k for k, (n, _) in enumerate(logs) if n]
    for k in ended:
        n, ours = logs[k]
        assert ref_logs[k].get("n") == n, (k, ref_logs[k], n)
        for name, value in ours.items():
            assert value == pytest.approx(ref_logs[k][name], rel=1e-6, abs=1e-6), (k, name)
    # an env that ends no episode in STEPS steps tests nothing of the log
    if env not in ("go", "enduro"):
        assert ended


@pytest.mark.parametrize("env", sorted(ocean_cases.ALL))
def test_envs_on_threads_keep_their_own_streams(env, ocean_builds):
    """Envs stepped at once on three threads equal the same envs stepped one
    by one: each draws from its own stream (PufferLib's share one)."""
    _, kwargs, _ = ocean_cases.ALL[env]
    plugin = plugin_driver.Plugin(ocean_builds(env))
    desc = plugin.describe(**kwargs)
    actions = ocean_cases.random_actions(desc, 300, np.random.default_rng(5))
    alone = [_envd_run(plugin, seed, kwargs, actions) for seed in (3, 4, 5)]
    together = [None] * 3

    def run(k):
        together[k] = _envd_run(plugin, 3 + k, kwargs, actions)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for a, b in zip(alone, together):
        for x, y in zip(a[:3], b[:3]):
            assert x.tobytes() == y.tobytes()
    # and the seeds matter
    assert alone[0][0].tobytes() != alone[1][0].tobytes()


@pytest.mark.parametrize("env", sorted(ocean_cases.REPRODUCIBLE))
def test_clock_seeded_envs_are_reproducible_from_their_seed(env, ocean_builds):
    """terraform and checkers seed from the clock (and terraform the pid): in
    envd those are the env's virtual ones, so a seed gives one trajectory,
    run after run, and another seed another."""
    _, kwargs, _ = ocean_cases.REPRODUCIBLE[env]
    plugin = plugin_driver.Plugin(ocean_builds(env))
    desc = plugin.describe(**kwargs)
    actions = ocean_cases.random_actions(desc, 400, np.random.default_rng(1))
    first = _envd_run(plugin, 7, kwargs, actions)
    again = _envd_run(plugin, 7, kwargs, actions)
    other = _envd_run(plugin, 8, kwargs, actions)
    assert first[0].tobytes() == again[0].tobytes()
    assert first[1].tobytes() == again[1].tobytes()
    assert first[0].tobytes() != other[0].tobytes()


@pytest.mark.parametrize("env", ["breakout", "go", "tetris"])
def test_reset_with_a_seed_restarts_the_stream(env, ocean_builds):
    """reset(seed=t) is srand(t) then c_reset, as PufferLib's vec_reset: the
    env then equals a fresh one seeded t, whatever it drew before."""
    _, kwargs, _ = ocean_cases.EXACT[env]
    plugin = plugin_driver.Plugin(ocean_builds(env))
    desc = plugin.describe(**kwargs)
    actions = ocean_cases.random_actions(desc, 200, np.random.default_rng(2))
    fresh = _envd_run(plugin, 11, kwargs, actions)
    inst = plugin_driver.Instance(plugin, 3, **kwargs)
    try:
        inst.reset()
        for a in actions[:57]:
            inst.step(a.astype(np.int64))
        obs = [inst.reset(seed=11)]
        for a in actions:
            obs.append(inst.step(a.astype(np.int64))[0])
    finally:
        inst.close()
    assert np.stack(obs).tobytes() == fresh[0].tobytes()
