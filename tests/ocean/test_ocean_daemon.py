"""puffer:<env> through the daemon: served only with --ocean, from the
operator's cache; every transport equals envd.make in-process (itself
checked against PufferLib in test_ocean_make.py), sync and async."""
from __future__ import annotations

import contextlib

import numpy as np
import ocean_cases
import puffer_reference
import pytest
from support.daemon import DaemonProcess, segments_of

import envd

PATHS = [("shm", False), ("shm", True), ("inline", False)]
ENVS = ["breakout", "snake", "terraform", "squared", "pong", "tetris", "checkers"]
STEPS = 200


@pytest.fixture(scope="module")
def ocean_daemon(tmp_path_factory, ocean_builds):
    for env in ocean_cases.ALL:
        ocean_builds(env)
    cache = puffer_reference.test_cache()
    with DaemonProcess(tmp_path_factory.mktemp("ocean") / "daemon", "--threads", "2",
                       "--lease-timeout", "10", "--ocean", "all", "--ocean-cache",
                       str(cache)) as proc:
        yield proc
    assert proc.proc.returncode == 0, proc.log()
    assert segments_of(proc.pid) == []


def _actions(env_id, num_rows, rng, steps):
    if env_id == "puffer:terraform":
        return rng.integers(0, [5, 5, 3], size=(steps, num_rows, 3))
    n = {"puffer:breakout": 3, "puffer:snake": 4, "puffer:squared": 5, "puffer:pong": 3,
         "puffer:tetris": 7, "puffer:checkers": 8 * 8 * 8}[env_id]
    return rng.integers(0, n, size=(steps, num_rows))


def _run(env, actions):
    obs = [env.reset()[0].copy()]
    rews, terms = [], []
    for a in actions:
        o, r, t, trunc, _ = env.step(a)
        assert not trunc.any()
        obs.append(o.copy())
        rews.append(r.copy())
        terms.append(t.copy())
    return np.stack(obs), np.stack(rews), np.stack(terms)


@pytest.mark.parametrize("transport,fast_path", PATHS)
@pytest.mark.parametrize("env", ENVS)
def test_daemon_equals_in_process(ocean_daemon, env, transport, fast_path, monkeypatch):
    monkeypatch.setenv("ENVD_OCEAN_CACHE", str(puffer_reference.test_cache()))
    kwargs = ocean_cases.ALL[env][1]
    env_id = f"puffer:{env}"
    with envd.make(env_id, 3, seed=5, num_threads=0, **kwargs) as local:
        actions = _actions(env_id, local.num_envs, np.random.default_rng(1), STEPS)
        expected = _run(local, actions)
    with ocean_daemon.connect() as client:
        with client.make(env_id, 3, seed=5, transport=transport, fast_path=fast_path,
                         **kwargs) as remote:
            got = _run(remote, actions)
    for a, b in zip(expected, got):
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("where", ["daemon", "in-process"])
@pytest.mark.parametrize("env_id", ["puffer:breakout", "puffer:squared", "puffer:tetris",
                                    "puffer:checkers"])
def test_async_equals_sync_in_process(ocean_daemon, env_id, where, monkeypatch):
    """send/recv of half batches: each env's rows as a sync in-process run
    (breakout and tetris write their rows directly everywhere, squared and
    checkers only in-process: either way a batch's rows are its envs' own)."""
    monkeypatch.setenv("ENVD_OCEAN_CACHE", str(puffer_reference.test_cache()))
    with envd.make(env_id, 4, seed=9, num_threads=0) as local:
        actions = _actions(env_id, 4, np.random.default_rng(2), 130)
        expected = _run(local, actions)[0]
    with contextlib.ExitStack() as stack:
        if where == "daemon":
            client = stack.enter_context(ocean_daemon.connect())
            env = stack.enter_context(client.make(env_id, 4, seed=9, batch_size=2))
        else:
            env = stack.enter_context(envd.make(env_id, 4, seed=9, batch_size=2, num_threads=2))
        env.async_reset()
        steps = [0] * 4
        seen = {i: [] for i in range(4)}
        while min(steps) < 100:  # each env's obs after reset and 99 steps
            obs, _, _, _, info = env.recv()
            ids = info["env_id"]
            for row, i in enumerate(ids):
                seen[i].append(obs[row].copy())
            env.send(np.array([actions[steps[i], i] for i in ids]), ids)
            for i in ids:
                steps[i] += 1
    for i in range(4):
        assert np.stack(seen[i][:100]).tobytes() == expected[:100, i].tobytes()


def test_a_daemon_without_ocean_refuses_puffer_ids(tmp_path, ocean_builds):
    ocean_builds("pong")
    with DaemonProcess(tmp_path / "plain", "--threads", "1") as proc:
        with proc.connect() as client:
            with pytest.raises(envd.UnknownEnvError, match="puffer:pong"):
                client.make("puffer:pong", 1)
            assert "puffer:pong" not in client.list_envs()
    assert proc.proc.returncode == 0, proc.log()


def test_ocean_envs_the_cache_lacks_are_reported(tmp_path, ocean_builds):
    """--ocean of an env never built: logged and in `envd status`, the daemon
    serves the rest."""
    ocean_builds("pong")
    cache = puffer_reference.test_cache()
    with DaemonProcess(tmp_path / "partial", "--threads", "1", "--ocean", "pong,moba",
                       "--ocean-cache", str(cache)) as proc:
        with proc.connect() as client:
            status = client.status()
            errors = [p["error"] for p in status["plugins"] if "error" in p]
            assert any("--ocean moba: no build" in e for e in errors), status["plugins"]
            with client.make("puffer:pong", 1, seed=0) as env:
                env.reset()
    assert proc.proc.returncode == 0, proc.log()


def test_an_envs_own_heap_counts_against_max_state_bytes(tmp_path, ocean_builds):
    """A client cannot grow the daemon's memory past --max-state-bytes
    through kwargs that make the env's init allocate (snake's grid and
    bodies: ~35 MB per env at these); a small snake is served."""
    ocean_builds("snake")
    limit = 64 << 20
    big = {"width": 1280, "height": 1280, "num_snakes": 1024, "num_food": 64,
           "max_snake_length": 4096}
    with DaemonProcess(tmp_path / "heap", "--threads", "1", "--ocean", "snake",
                       "--ocean-cache", str(puffer_reference.test_cache()),
                       "--max-state-bytes", str(limit)) as proc:
        with proc.connect() as client:
            with pytest.raises(envd.LimitExceededError,
                               match=r"its own code allocates per env.*--max-state-bytes"):
                client.make("puffer:snake", 2, **big)
            with client.make("puffer:snake", 2, seed=0, **ocean_cases.ALL["snake"][1]) as env:
                env.reset()
                env.step(np.zeros(env.num_envs, dtype=np.int64))
                assert 0 < client.status()["state_bytes"] < limit
            assert client.status()["state_bytes"] == 0
    assert proc.proc.returncode == 0, proc.log()


def _run_in_place(env, actions):
    """_run's records through PufferLib's loop: actions written into
    env.actions, step_in_place(), the results read from the env's views."""
    obs = [env.reset()[0].copy()]
    rews, terms = [], []
    for a in actions:
        env.actions[...] = a
        env.step_in_place()
        assert not env.truncations.any()
        obs.append(env.observations.copy())
        rews.append(env.rewards.copy())
        terms.append(env.terminations.copy())
    return np.stack(obs), np.stack(rews), np.stack(terms)


@pytest.mark.parametrize("transport,fast_path", [*PATHS, ("in-process", False)])
@pytest.mark.parametrize("env", ["breakout", "terraform"])
def test_in_place_equals_step_in_process(ocean_daemon, env, transport, fast_path,
                                         monkeypatch):
    monkeypatch.setenv("ENVD_OCEAN_CACHE", str(puffer_reference.test_cache()))
    kwargs = ocean_cases.ALL[env][1]
    env_id = f"puffer:{env}"
    with envd.make(env_id, 3, seed=5, num_threads=0, **kwargs) as local:
        actions = _actions(env_id, local.num_envs, np.random.default_rng(1), STEPS)
        expected = _run(local, actions)
    if transport == "in-process":
        with envd.make(env_id, 3, seed=5, **kwargs) as env_:
            got = _run_in_place(env_, actions)
    else:
        with ocean_daemon.connect() as client:
            with client.make(env_id, 3, seed=5, transport=transport, fast_path=fast_path,
                             **kwargs) as remote:
                got = _run_in_place(remote, actions)
    for a, b in zip(expected, got):
        assert a.tobytes() == b.tobytes()
