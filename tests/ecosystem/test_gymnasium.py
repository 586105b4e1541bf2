"""envd in gymnasium's registry (envd.gymnasium_registry, envd.single_env):
gymnasium.make_vec("envd/<id>") is envd.make bit for bit, in-process and
through a daemon (endpoint=); gymnasium.make("envd/<id>") is a checked
gymnasium.Env equal to gymnasium's own env; "envd:<id>" means envd's env;
gymnasium's own ids are untouched; plugins' ids are registered when loaded."""
from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from support.builtin_envs import MULTI_AGENT_ENV_IDS, random_actions
from support.daemon import in_bounds_actions, wait_until

import envd
from envd.gymnasium_registry import BUILTIN_ENV_IDS
from envd.single_env import EnvdEnv

STEPS = 300


def assert_same_results(got, want, where: str) -> None:
    """Bit-equal arrays and the same info (episode times are wall clock)."""
    for name, a, b in zip(("obs", "rewards", "terminations", "truncations"), got[:-1], want[:-1]):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), f"{name}, {where}"
    assert got[-1].keys() == want[-1].keys(), where
    if "envd_episode" in want[-1]:
        for key in "rl":
            assert got[-1]["envd_episode"][key].tobytes() == \
                want[-1]["envd_episode"][key].tobytes(), where


def run_pair(env, ref, num_envs: int, seed: int) -> int:
    """Step env and ref (envd.make's twin) with the same actions; every result
    must be bit-equal.  Returns the number of episodes that ended."""
    assert env.single_observation_space == ref.single_observation_space
    assert env.single_action_space == ref.single_action_space
    assert env.metadata["autoreset_mode"] == ref.metadata["autoreset_mode"]
    assert_same_results(env.reset(seed=seed), ref.reset(seed=seed), "reset")
    rng = np.random.default_rng(seed)
    ended = 0
    for step in range(STEPS):
        actions = in_bounds_actions(env.single_action_space, num_envs, rng)
        got, want = env.step(actions), ref.step(actions)
        assert_same_results(got, want, f"step {step}")
        ended += int((want[2] | want[3]).sum())
    return ended


def test_builtin_ids_are_the_native_built_ins():
    """envd registers the built-ins without loading native code: its list
    must be the native registry's built-ins, each as envd/<id>."""
    from envd.native import get_spec
    builtins = [i for i in envd.list_envs() if get_spec(i).origin == "builtin"]
    assert sorted(BUILTIN_ENV_IDS) == builtins
    for env_id in builtins:
        spec = gym.spec(f"envd/{env_id}")
        assert spec.namespace == "envd" and spec.kwargs == {"envd_id": env_id}
        assert spec.max_episode_steps is None  # envd keeps its own time limit


def test_import_registers_without_loading_native_code():
    code = ("import sys, gymnasium, envd; assert 'envd.native' not in sys.modules; "
            "assert 'envd/CartPole-v1' in gymnasium.registry; "
            "assert 'envd.native' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd="/")


@pytest.mark.parametrize("env_id, kwargs", [
    ("CartPole-v1", {}),
    ("CartPole-v1", {"autoreset_mode": "same_step", "max_episode_steps": 30}),
    ("Pendulum-v1", {"g": 3.5}),
    ("MountainCarContinuous-v0", {"autoreset_mode": "disabled", "max_episode_steps": 1000}),
    ("ConnectFour-v0", {}),
    ("Snake-v0", {"episode_statistics": "episode"}),
])
def test_make_vec_is_envd_make_bit_for_bit(env_id, kwargs):
    num_envs, seed = 5, 11
    env = gym.make_vec(f"envd/{env_id}", num_envs=num_envs, seed=seed, **kwargs)
    ref = envd.make(env_id, num_envs, seed=seed, **kwargs)
    assert isinstance(env, envd.VecEnv) and env.num_envs == num_envs
    assert env.spec.id == f"envd/{env_id}"
    if kwargs.get("autoreset_mode") != "disabled":
        assert run_pair(env, ref, num_envs, seed) > 0
    else:
        run_pair(env, ref, num_envs, seed)
    env.close()
    ref.close()


def test_make_vec_refuses_what_envd_make_refuses():
    with pytest.raises(envd.InvalidArgumentError, match="no parameter 'gravity'"):
        gym.make_vec("envd/CartPole-v1", num_envs=2, gravity=1.0)
    with pytest.raises(envd.InvalidArgumentError, match="num_envs"):
        gym.make_vec("envd/CartPole-v1", num_envs=0)
    with pytest.raises(gym.error.Error):  # gymnasium's own "not registered" error
        gym.make_vec("envd/NoSuchEnv-v0", num_envs=2)


def test_make_vec_sync_mode_steps_single_envd_envs():
    """vectorization_mode="sync" still works: gymnasium's SyncVectorEnv over
    envd single envs, equal to envd.make (autoreset aside, which gymnasium does)."""
    env = gym.make_vec("envd/CartPole-v1", num_envs=3, vectorization_mode="sync")
    ref = envd.make("CartPole-v1", 3)
    obs, _ = env.reset(seed=4)
    assert isinstance(env, gym.vector.SyncVectorEnv)
    assert obs.tobytes() == ref.reset(seed=4)[0].tobytes()
    for _ in range(5):
        actions = np.array([0, 1, 1])
        assert env.step(actions)[0].tobytes() == ref.step(actions)[0].tobytes()
    env.close()
    ref.close()


def test_daemon_served_through_endpoint(daemon, monkeypatch):
    """endpoint=... gives the daemon's RemoteVecEnv, bit-equal to envd.make;
    the connection opened for it closes with the env (the daemon then holds
    no session and only the probe's connection); endpoint="default" follows
    ENVD_ENDPOINT; an open Client may be passed and stays open."""
    probe = daemon.connect()
    num_envs, seed = 4, 3
    env = gym.make_vec("envd/CartPole-v1", num_envs=num_envs, seed=seed,
                       endpoint=daemon.endpoint)
    assert isinstance(env, envd.RemoteVecEnv)
    with envd.make("CartPole-v1", num_envs, seed=seed) as ref:
        assert run_pair(env, ref, num_envs, seed) > 0
    assert probe.status()["sessions"] == 1
    env.close()
    wait_until(lambda: probe.status()["clients"] == 1 and probe.status()["sessions"] == 0,
               what="the env's own connection to close")

    monkeypatch.setenv("ENVD_ENDPOINT", daemon.endpoint)
    env = gym.make_vec("envd/Pendulum-v1", num_envs=2, seed=0, endpoint="default",
                       autoreset_mode="same_step")
    assert isinstance(env, envd.RemoteVecEnv) and probe.status()["sessions"] == 1
    env.close()

    env = gym.make_vec("envd/Acrobot-v1", num_envs=2, seed=0, endpoint=probe)
    env.close()
    assert not probe.closed and probe.status()["sessions"] == 0
    wait_until(lambda: probe.status()["clients"] == 1, what="connections to close")

    # a refused make closes the connection it opened
    with pytest.raises(envd.UnknownEnvError):
        gym.make_vec("envd/CartPole-v1", num_envs=2, endpoint=daemon.endpoint, envd_id="Nope")
    wait_until(lambda: probe.status()["clients"] == 1, what="the refused make's connection")
    probe.close()


def test_gymnasium_own_ids_are_untouched():
    """Importing envd adds envd/... ids and changes no other entry."""
    code = """
import gymnasium
def table():
    return {k: (repr(s.entry_point), repr(s.vector_entry_point), s.kwargs, s.max_episode_steps)
            for k, s in gymnasium.registry.items()}
before = table()
import envd
after = table()
assert all(after[k] == v for k, v in before.items())
added = set(after) - set(before)
assert added and all(k.startswith("envd/") for k in added), added
env = gymnasium.make_vec("CartPole-v1", num_envs=2)
assert type(env).__module__.startswith("gymnasium."), type(env)
assert type(gymnasium.make("CartPole-v1").unwrapped).__module__.startswith("gymnasium."), 1
"""
    subprocess.run([sys.executable, "-c", code], check=True, cwd="/")


def test_envd_module_prefix_means_envd_envs():
    """"envd:CartPole-v1" is envd's CartPole once envd is imported; imported
    by that very lookup, envd raises a clear error (gymnasium would look up its
    own CartPole) and the call after it gets envd's env."""
    env = gym.make_vec("envd:CartPole-v1", num_envs=2, seed=0)
    assert isinstance(env, envd.VecEnv)
    env.close()
    assert isinstance(gym.make("envd:CartPole-v1").unwrapped, EnvdEnv)
    assert isinstance(gym.make_vec("envd:envd/Acrobot-v1", num_envs=1), envd.VecEnv)
    with pytest.raises(gym.error.Error, match="NoSuchEnv.* namespace envd"):
        gym.make_vec("envd:NoSuchEnv-v0", num_envs=1)
    code = """
import gymnasium
try:
    gymnasium.make_vec("envd:CartPole-v1", num_envs=2)
except gymnasium.error.Error as e:
    assert "Write 'envd/CartPole-v1'" in str(e), e
else:
    raise AssertionError("no error")
import envd
assert isinstance(gymnasium.make_vec("envd:CartPole-v1", num_envs=2), envd.VecEnv)
"""
    subprocess.run([sys.executable, "-c", code], check=True, cwd="/")


# ---- gymnasium.make: one env -------------------------------------------------------
@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1", "MountainCarContinuous-v0",
                                    "Acrobot-v1", "MountainCar-v0"])
def test_single_env_equals_gymnasium_env(env_id):
    """gymnasium.make("envd/<id>") steps as gymnasium.make("<id>") does, bit
    for bit, across episodes (reset after each, as a gymnasium.Env is driven)."""
    ours, theirs = gym.make(f"envd/{env_id}"), gym.make(env_id)
    assert ours.observation_space == theirs.observation_space
    assert ours.action_space == theirs.action_space
    rng = np.random.default_rng(0)
    episodes = 0
    for seed in (0, 7, None):
        a, b = ours.reset(seed=seed), theirs.reset(seed=seed)
        assert a[0].tobytes() == b[0].tobytes() and a[0].dtype == b[0].dtype
        for step in range(1000):
            action = random_actions(ours.action_space, 1, rng)[0]
            if isinstance(ours.action_space, gym.spaces.Box):
                action = np.clip(action, ours.action_space.low, ours.action_space.high)
            got, want = ours.step(action), theirs.step(action)
            assert got[0].tobytes() == want[0].tobytes(), (seed, step)
            assert got[1] == np.float32(want[1]) and type(got[1]) is float
            assert got[2:4] == want[2:4] and type(got[2]) is type(got[3]) is bool
            if got[2] or got[3]:
                assert got[4]["envd_episode"]["l"] == step + 1
                episodes += 1
                break
    assert episodes >= 1
    ours.close()
    theirs.close()


@pytest.mark.parametrize("env_id", sorted(set(BUILTIN_ENV_IDS) - set(MULTI_AGENT_ENV_IDS)))
def test_single_env_passes_gymnasium_env_checker(env_id):
    env = gym.make(f"envd/{env_id}", disable_env_checker=True)
    check_env(env.unwrapped, skip_render_check=True)
    env.close()


@pytest.mark.parametrize("env_id", MULTI_AGENT_ENV_IDS)
def test_single_env_refuses_a_multi_agent_env_clearly(env_id):
    """gymnasium.make of a multi-agent built-in says to make a vector env (its
    agents are rows of one) instead of a wrapper error about num_envs."""
    with pytest.raises(envd.InvalidArgumentError, match="multi-agent env .3 agents.*make_vec"):
        gym.make(f"envd/{env_id}", disable_env_checker=True)
    with gym.make_vec(f"envd/{env_id}", num_envs=2) as env:
        assert env.num_envs == 6


def test_single_env_refuses_what_it_cannot_do():
    env = gym.make("envd/CartPole-v1")
    env.reset(seed=0)
    while True:
        _, _, terminated, truncated, _ = env.step(1)
        if terminated or truncated:
            break
    with pytest.raises(envd.EnvStateError, match="episode has ended.*call reset"):
        env.step(1)  # a finished episode needs reset, as in any gymnasium.Env
    env.reset()
    with pytest.raises(envd.InvalidActionError, match="out of range"):
        env.step(5)
    with pytest.raises(envd.InvalidArgumentError, match="reset options"):
        env.reset(options={"x": 1})
    env.close()
    with pytest.raises(envd.InvalidArgumentError, match="num_envs"):
        gym.make("envd/CartPole-v1", num_envs=2)
    with pytest.raises(envd.InvalidArgumentError, match="num_envs=1"):
        EnvdEnv(envd.make("CartPole-v1", 2, autoreset_mode="disabled"))


def test_single_env_through_the_daemon(daemon):
    probe = daemon.connect()
    env = gym.make("envd/CartPole-v1", endpoint=daemon.endpoint)
    assert isinstance(env.unwrapped.venv, envd.RemoteVecEnv)
    ref = gym.make("CartPole-v1")
    assert env.reset(seed=5)[0].tobytes() == ref.reset(seed=5)[0].tobytes()
    for step in range(500):
        got, want = env.step(step % 2), ref.step(step % 2)
        assert got[0].tobytes() == want[0].tobytes() and got[1:4] == want[1:4]
        if got[2] or got[3]:
            break
    env.close()
    wait_until(lambda: probe.status()["clients"] == 1 and probe.status()["sessions"] == 0,
               what="the env's connection to close")
    probe.close()


def test_plugin_ids_are_registered_when_loaded(tmp_path):
    from support.plugin_checks import EXAMPLE_SOURCE, build_plugin, run_check
    library = build_plugin(EXAMPLE_SOURCE, tmp_path / "libguess_number.so")
    run_check("gymnasium_ids_of_plugin", str(library))
