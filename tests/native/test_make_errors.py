"""Every bad call raises an envd.EnvdError subclass whose message names the
problem and the valid values, and leaves the env usable."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import envd
from envd import EnvdError, EnvStateError, InvalidActionError, InvalidArgumentError, UnknownEnvError


def still_usable(env):
    """The env steps normally after the failed call, and matches a fresh env
    driven with the same seed and actions."""
    fresh = envd.make(env.envd_spec.id, env.num_envs, seed=17)
    env.reset(seed=17)
    fresh.reset()
    actions = env.action_space.sample()
    assert env.step(actions)[0].tobytes() == fresh.step(actions)[0].tobytes()
    fresh.close()


def test_unknown_env_id_lists_known_ids():
    with pytest.raises(UnknownEnvError) as err:
        envd.make("CartPole-v0", 4)
    message = str(err.value)
    assert "'CartPole-v0'" in message
    for env_id in envd.list_envs():
        assert env_id in message
    assert isinstance(err.value, EnvdError) and isinstance(err.value, ValueError)


@pytest.mark.parametrize("typo,meant", [("CartPole-v0", "CartPole-v1"),
                                         ("cartpole-v1", "CartPole-v1"),
                                         ("Pendulum", "Pendulum-v1"),
                                         ("MountainCarContinous-v0", "MountainCarContinuous-v0")])
def test_a_mistyped_env_id_gets_a_did_you_mean(typo, meant):
    with pytest.raises(UnknownEnvError) as err:
        envd.make(typo, 2)
    message = str(err.value)
    assert message.startswith(f"unknown env id {typo!r} (did you mean {meant!r}")
    assert "; known ids: Acrobot-v1, CartPole-v1" in message  # the whole list still follows


def test_an_env_id_like_none_gets_no_suggestion():
    with pytest.raises(UnknownEnvError) as err:
        envd.make("Zebra", 2)
    assert "did you mean" not in str(err.value)
    assert str(err.value).startswith("unknown env id 'Zebra'; known ids: ")


@pytest.mark.parametrize("env_id,kwargs,hint", [
    ("Pendulum-v1", {"gg": 9.81}, "'gg' (did you mean 'g'?)"),
    ("CartPole-v1", {"sutton_barto": True},
     "'sutton_barto' (did you mean 'sutton_barto_reward'?)"),
    ("ConnectFour-v0", {"Depth": 2}, "'Depth' (did you mean 'depth'?)"),
    # make's own arguments, mistyped, land among the env kwargs
    ("CartPole-v1", {"sed": 0}, "'sed' (did you mean make's argument 'seed'?)"),
    ("Acrobot-v1", {"num_thread": 1}, "'num_thread' (did you mean make's argument 'num_threads'?)"),
    ("Pendulum-v1", {"autoreset": "same_step"},
     "'autoreset' (did you mean make's argument 'autoreset_mode'?)"),
])
def test_a_mistyped_kwarg_gets_a_did_you_mean(env_id, kwargs, hint):
    with pytest.raises(InvalidArgumentError) as err:
        envd.make(env_id, 2, **kwargs)
    assert f"{env_id} has no parameter {hint}; its parameters are: " in str(err.value)


def test_only_the_mistyped_kwargs_get_suggestions():
    with pytest.raises(InvalidArgumentError) as err:
        envd.make("Pendulum-v1", 2, gravity=9.81, g2=1.0)
    assert "has no parameter 'g2' (did you mean 'g'?), 'gravity'; its parameters" in str(err.value)


@pytest.mark.parametrize("bad", [(4, 1), (3,), (5,), ()])
def test_actions_of_wrong_shape(bad):
    with envd.make("CartPole-v1", 4, seed=0) as env:
        env.reset()
        with pytest.raises(InvalidActionError, match=r"shape \(4,\)"):
            env.step(np.zeros(bad, np.int64))
        still_usable(env)


def test_box_actions_of_wrong_shape():
    with envd.make("Pendulum-v1", 2, seed=0) as env:
        env.reset()
        with pytest.raises(InvalidActionError, match=r"shape \(2, 1\)"):
            env.step(np.zeros(2, np.float32))
        still_usable(env)


@pytest.mark.parametrize("env_id,dtype", [("CartPole-v1", np.float32),
                                          ("CartPole-v1", np.float64),
                                          ("Pendulum-v1", np.float64),
                                          ("Pendulum-v1", np.int64),
                                          ("Pendulum-v1", np.complex64)])
def test_actions_of_wrong_dtype(env_id, dtype):
    with envd.make(env_id, 3, seed=0) as env:
        env.reset()
        actions = np.zeros(env.action_space.shape, dtype)
        with pytest.raises(InvalidActionError, match="dtype") as err:
            env.step(actions)
        assert str(env.single_action_space.dtype) in str(err.value)
        still_usable(env)


def test_compatible_action_dtypes_are_accepted():
    with envd.make("CartPole-v1", 3, seed=0) as env:
        env.reset()
        env.step(np.array([0, 1, 1], np.int32))
        env.step([1, 0, 1])  # a Python list
    with envd.make("Pendulum-v1", 2, seed=0) as env:
        env.reset()
        env.step([[0.5], [-1.0]])  # Python floats
        env.step(np.zeros((2, 1), np.float16))  # safe cast to float32


@pytest.mark.parametrize("value", [2, -1, 2**40])
def test_discrete_action_out_of_range(value):
    with envd.make("CartPole-v1", 5, seed=0) as env:
        obs = env.reset()[0]  # a view of the env's buffer
        before = obs.copy()
        actions = np.zeros(5, np.int64)
        actions[3] = value
        with pytest.raises(InvalidActionError, match=r"env 3 is out of range.*0\.\.1"):
            env.step(actions)
        assert obs.tobytes() == before.tobytes(), "a rejected step must step no env"
        still_usable(env)


@pytest.mark.parametrize("row", [0, 7, 14])  # 5 envs x 3 agents: the first, a middle, the last
@pytest.mark.parametrize("value", [5, -1, 2**62])
def test_multi_agent_discrete_action_out_of_range(row, value):
    """A multi-agent env's Discrete actions are checked in one pass over
    every agent's row (vec.c): one bad agent row anywhere is refused by a
    step and by a send, named, and nothing moves."""
    with envd.make("simple_spread_v3", 5, seed=0) as env:
        obs = env.reset()[0]
        before = obs.copy()
        actions = np.zeros(env.num_envs, np.int64)
        actions[row] = value
        with pytest.raises(InvalidActionError, match=rf"action {value} of env {row} is out of range"):
            env.step(actions)
        assert obs.tobytes() == before.tobytes(), "a rejected step must step no env"
        env.step(np.zeros(env.num_envs, np.int64))
    with envd.make("simple_spread_v3", 5, seed=0, batch_size=5) as env:
        env.async_reset()
        ids = env.recv()[4]["env_id"]  # (each env's id once per agent row)
        actions = np.zeros(len(ids), np.int64)
        actions[row] = value
        named = int(ids[row]) * 3 + row % 3  # the agent's row of its env
        with pytest.raises(InvalidActionError, match=rf"action {value} of env {named} is out"):
            env.send(actions, ids)
        env.send(np.zeros(len(ids), np.int64), ids)  # nothing was marked in flight
        assert sorted(env.recv()[4]["env_id"].tolist()) == sorted(ids.tolist())


def test_unsigned_actions_beyond_int64_are_out_of_range():
    with envd.make("CartPole-v1", 2, seed=0) as env:
        env.reset()
        with pytest.raises(InvalidActionError, match="action 9223372036854775808 of env 1 is out of range"):
            env.step(np.array([0, 2**63], np.uint64))
        env.step(np.array([0, 1], np.uint64))


@pytest.mark.parametrize("num_envs", [0, -3, envd.native.MAX_NUM_ENVS + 1])
def test_num_envs_out_of_range(num_envs):
    with pytest.raises(InvalidArgumentError, match=r"num_envs.*1 <= num_envs <= 1048576"):
        envd.make("CartPole-v1", num_envs)


@pytest.mark.parametrize("num_envs", [2.0, "8", None, True])
def test_num_envs_not_an_int(num_envs):
    with pytest.raises(InvalidArgumentError, match="num_envs must be an int"):
        envd.make("CartPole-v1", num_envs)


def test_unknown_env_kwarg_lists_parameters():
    with pytest.raises(InvalidArgumentError, match=r"no parameter 'gravity'.*g \(float"):
        envd.make("Pendulum-v1", 2, gravity=9.81)
    with pytest.raises(InvalidArgumentError, match="its parameters are: none"):
        envd.make("Acrobot-v1", 2, book_or_nips="nips")


@pytest.mark.parametrize("env_id,kwargs,match", [
    ("Pendulum-v1", {"g": "9.81"}, "must be a float"),
    ("Pendulum-v1", {"g": True}, "must be a float"),
    ("Pendulum-v1", {"g": float("nan")}, "out of range"),
    ("Pendulum-v1", {"g": -1.0}, "out of range"),
    ("Pendulum-v1", {"g": 10**400}, "out of range"),
    ("CartPole-v1", {"sutton_barto_reward": 1}, "must be a bool"),
    ("MountainCar-v0", {"goal_velocity": {"v": 0.1}}, "must be a float"),
    # a list means one value per env (docs/writing-envs.md): of num_envs values
    ("MountainCar-v0", {"goal_velocity": [0.1]}, "has 1 values but num_envs=2"),
    ("MountainCar-v0", {"goal_velocity": [0.1, "x"]}, "must be a float.*env 1 of the list"),
])
def test_ill_typed_env_kwargs(env_id, kwargs, match):
    with pytest.raises(InvalidArgumentError, match=match):
        envd.make(env_id, 2, **kwargs)


def test_gymnasium_autoreset_mode_values_are_accepted():
    for mode in ("NextStep", gym.vector.AutoresetMode.SAME_STEP):
        with envd.make("CartPole-v1", 2, autoreset_mode=mode) as env:
            assert env.metadata["autoreset_mode"] == gym.vector.AutoresetMode(mode)


def test_valid_kwarg_types_are_accepted():
    with envd.make("Pendulum-v1", 1, g=9) as env:  # an int for a float parameter
        env.reset(seed=0)
    with envd.make("CartPole-v1", 1, sutton_barto_reward=np.bool_(True)) as env:
        env.reset(seed=0)


@pytest.mark.parametrize("mode", ["next-step", "NEXT_STEP", "", 0])
def test_unknown_autoreset_mode(mode):
    with pytest.raises(InvalidArgumentError,
                       match="valid modes: 'next_step', 'same_step', 'disabled'"):
        envd.make("CartPole-v1", 2, autoreset_mode=mode)


def test_autoreset_mode_none_is_the_default_next_step():
    """None (make's default since ABI 5: an env that resets itself refuses
    the argument when given) is next_step."""
    with envd.make("CartPole-v1", 2, autoreset_mode=None) as env:
        assert env.metadata["autoreset_mode"] is AutoresetMode.NEXT_STEP


@pytest.mark.parametrize("kwargs,match", [
    ({"num_threads": -1}, "num_threads"), ({"num_threads": 10_000}, "num_threads"),
    ({"max_episode_steps": -1}, "max_episode_steps"), ({"seed": -1}, "seed"),
    ({"seed": [1, 2]}, "num_envs=3"), ({"seed": 1.5}, "seed"),
    ({"seed": np.array(5)}, "seed"), ({"seed": [1, 2, True]}, "seed"),
    ({"pin_cpus": 5, "num_threads": 1}, "pin_cpus"),
    ({"pin_cpus": [0.0], "num_threads": 1}, "pin_cpus"),
    ({"pin_cpus": [True], "num_threads": 1}, "pin_cpus"),
])
def test_other_bad_make_arguments(kwargs, match):
    with pytest.raises(InvalidArgumentError, match=match):
        envd.make("CartPole-v1", 3, **kwargs)


def test_bad_reset_arguments():
    with envd.make("CartPole-v1", 3, seed=0) as env:
        with pytest.raises(InvalidArgumentError, match="reset_mask"):
            env.reset(options={"reset_mask": [True, False, True]})
        with pytest.raises(InvalidArgumentError, match="unsupported reset options"):
            env.reset(options={"low": -0.1})
        with pytest.raises(InvalidArgumentError, match="seed"):
            env.reset(seed="zero")
        for options in ([1], "reset_mask"):
            with pytest.raises(InvalidArgumentError, match="options must be a dict"):
                env.reset(options=options)
        still_usable(env)


def test_step_before_reset_and_after_close():
    env = envd.make("CartPole-v1", 2, seed=0)
    with pytest.raises(EnvStateError, match="reset"):
        env.step(np.zeros(2, np.int64))
    still_usable(env)
    env.close()
    env.close()  # idempotent
    with pytest.raises(EnvStateError, match="closed"):
        env.step(np.zeros(2, np.int64))
    with pytest.raises(EnvStateError, match="closed"):
        env.reset()


def test_stepping_a_done_env_in_disabled_mode():
    with envd.make("CartPole-v1", 2, seed=0, autoreset_mode="disabled") as env:
        env.reset()
        done = np.zeros(2, bool)
        while not done.any():
            _, _, term, trunc, _ = env.step(np.ones(2, np.int64))
            done = term | trunc
        with pytest.raises(EnvStateError, match=r"env \d is done.*reset_mask"):
            env.step(np.ones(2, np.int64))
        env.reset(options={"reset_mask": done})
        env.step(np.ones(2, np.int64))


@pytest.mark.parametrize("kind", ["native", "puffer", "py", "pz"])
def test_each_env_kinds_builder_takes_the_options_the_kind_declares(kind):
    """envd.make hands a kind's builder (make_options.KINDS) exactly the
    options the kind takes in-process: each is a keyword of the builder, and
    every option of envd.make is declared in make_options.OPTIONS."""
    import importlib
    import inspect

    from envd import make_options
    from envd.native.vector_env import MAKE_ARGUMENTS
    module, _, name = make_options.KINDS[kind].builder.partition(":")
    parameters = inspect.signature(getattr(importlib.import_module(module), name)).parameters
    assert set(make_options.KINDS[kind].options(make_options.IN_PROCESS)) - {"num_envs"} \
        <= {p for p, v in parameters.items() if v.kind is inspect.Parameter.KEYWORD_ONLY}
    assert set(MAKE_ARGUMENTS) <= set(make_options.OPTIONS)


def test_an_option_a_kind_does_not_take_is_refused_before_anything_is_made():
    with pytest.raises(InvalidArgumentError, match="CartPole-v1: num_workers is for hosted "
                                                   "Python envs .* a C env is stepped by a thread pool"):
        envd.make("CartPole-v1", 2, num_workers=1)
    with pytest.raises(InvalidArgumentError, match="py:CartPole-v1: pin_cpus is for C envs"):
        envd.make("py:CartPole-v1", 2, pin_cpus=[0])
    with pytest.raises(InvalidArgumentError, match="pz:m:f: max_episode_steps is for C envs .* "
                                                   "and hosted Python envs"):
        envd.make("pz:m:f", 2, max_episode_steps=5)
