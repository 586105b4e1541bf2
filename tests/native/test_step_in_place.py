"""The in-place step (PufferLib's loop: ``env.actions`` written, then
``step_in_place()``; envd.vector_base): the same trajectories and infos as
step() with the same seeds and actions, in-process (C envs, a multi-agent
one, a hosted Python env with Tuple actions) and through the daemon (shm,
fast path, inline); the same error as step() for a bad action written into
the buffer, with no env stepped; the state rules of step()."""
from __future__ import annotations

import gc
import pickle
import threading
import weakref

import numpy as np
import pytest
from hosted.envs import DictObsEnv, failing_creator
from hosted.equivalence import assert_same, sample_actions

import envd
from envd.errors import EnvStateError, InvalidActionError

STEPS = 150
NUM_ENVS = 4


def _write(env, actions) -> None:
    """actions (as step() takes them) into env.actions, leaf by leaf."""
    buffer = env.actions
    if isinstance(buffer, tuple):
        for view, value in zip(buffer, actions):
            view[...] = value
    else:
        buffer[...] = actions


def _copied(value):
    if isinstance(value, dict):
        return {k: _copied(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_copied(v) for v in value)
    return value.copy() if isinstance(value, np.ndarray) else value


def _timeless(record):
    """record (a reset's or step's tuple, copied) without its episodes'
    wall-clock times ("t": measured, so never equal between two runs)."""
    stats = record[-1].get("envd_episode")
    if stats is not None:
        times = stats.pop("t")
        assert times.shape == stats["l"].shape and (times >= 0).all()
    return record


def _by_step(env, actions):
    records = [_copied(env.reset(seed=3))]
    for a in actions:
        records.append(_timeless(_copied(env.step(a))))
    return records


def _in_place(env, actions):
    obs, info = env.reset(seed=3)
    if obs is not env.observations:  # (copy=True: reset returned a copy of it)
        assert_same(_copied(obs), _copied(env.observations), "reset")
    records = [_copied((obs, info))]
    ended = 0
    for a in actions:
        _write(env, a)
        num_done = env.step_in_place()
        info = env.step_info()
        ended += num_done
        assert (num_done > 0) == (env.episode_statistics_key in info)
        records.append(_timeless(_copied((env.observations, env.rewards, env.terminations,
                                          env.truncations, info))))
    return records, ended


def _actions(env, seed=1):
    rng = np.random.default_rng(seed)
    return [sample_actions(env.single_action_space, env.num_envs, rng) for _ in range(STEPS)]


CASES = [("CartPole-v1", {}), ("Pendulum-v1", {}), ("simple_spread_v3", {}),
         (DictObsEnv, {"num_workers": 0}), (DictObsEnv, {"num_workers": 1}),
         ("CartPole-v1", {"copy": True}), ("CartPole-v1", {"autoreset_mode": "same_step"})]


@pytest.mark.parametrize("env_id,kwargs", CASES)
def test_in_place_equals_step(env_id, kwargs):
    with envd.make(env_id, NUM_ENVS, seed=3, **kwargs) as a, \
            envd.make(env_id, NUM_ENVS, seed=3, **kwargs) as b:
        actions = _actions(a)
        if env_id == "Pendulum-v1":  # (in the space: Box actions beyond it are clipped alike)
            actions = [np.clip(x, -2, 2) for x in actions]
        expected = _by_step(a, actions)
        got, ended = _in_place(b, actions)
    assert ended > 0 or env_id == "Pendulum-v1"  # (episodes ended: their infos compared)
    for k, (x, y) in enumerate(zip(got, expected)):
        assert_same(x, y, f"{a.env_id} step {k}")


def test_the_views_are_the_buffers_step_returns():
    with envd.make("CartPole-v1", NUM_ENVS, seed=0, num_threads=0) as env:
        env.reset(seed=0)
        assert env.actions is env.actions and env.actions.flags.writeable
        assert env.actions.shape == (NUM_ENVS,) and env.actions.dtype == np.int64
        obs, rewards, terms, truncs, _ = env.step(np.ones(NUM_ENVS, np.int64))
        assert (env.actions == 1).all()  # (step() copied its actions into the buffer)
        assert obs is env.observations and rewards is env.rewards
        assert terms is env.terminations and truncs is env.truncations
        before = obs.copy()
        env.actions[:] = 0
        env.step_in_place()
        assert not np.array_equal(before, env.observations)


def test_copy_true_step_info_returns_copies():
    with envd.make("CartPole-v1", NUM_ENVS, seed=0, copy=True) as env:
        env.reset(seed=0)
        while not env.step_in_place():
            pass
        info = env.step_info()
        assert not np.shares_memory(info["_envd_episode"], env._buffers["dones"])


@pytest.mark.parametrize("env_id,bad", [("CartPole-v1", 2), ("CartPole-v1", -1),
                                         ("Acrobot-v1", 3)])
def test_a_bad_action_in_the_buffer_gets_steps_error_and_steps_nothing(env_id, bad):
    with envd.make(env_id, NUM_ENVS, seed=0) as a, envd.make(env_id, NUM_ENVS, seed=0) as b:
        a.reset(seed=0)
        b.reset(seed=0)
        actions = _actions(a)[0]
        actions[2] = bad
        with pytest.raises(InvalidActionError) as by_step:
            a.step(actions)
        before = b.observations.copy()
        b.actions[...] = actions
        with pytest.raises(InvalidActionError) as in_place:
            b.step_in_place()
        assert str(in_place.value) == str(by_step.value) and "env 2" in str(in_place.value)
        assert np.array_equal(b.observations, before)
        with pytest.raises(EnvStateError, match="none since the last reset"):
            b.step_info()  # (the refused step is no step)
        b.actions[2] = actions[3]  # fixed: the env goes on
        b.step_in_place()


def test_step_info_needs_a_step_and_a_closed_or_busy_env_refuses():
    env = envd.make("CartPole-v1", NUM_ENVS, seed=0)
    with pytest.raises(EnvStateError, match="none since the last reset"):
        env.step_info()
    env.reset(seed=0)
    with pytest.raises(EnvStateError, match="none since the last reset"):
        env.step_info()
    env.step_in_place()
    assert env.step_info() == {}  # (no episode ended in the first step)
    env.reset()
    with pytest.raises(EnvStateError, match="none since the last reset"):
        env.step_info()
    env._claim.pop()  # another thread's call in progress
    try:
        failed = []
        thread = threading.Thread(target=lambda: failed.append(_raises(env.step_in_place)))
        thread.start()
        thread.join()
        assert failed == [EnvStateError]
    finally:
        env._claim.append(True)
    env.close()
    with pytest.raises(EnvStateError, match="closed"):
        env.step_in_place()


def _raises(call):
    try:
        call()
    except Exception as exc:  # noqa: BLE001 -- the test looks at its type
        return type(exc)
    return None


def test_in_place_refused_while_envs_are_in_flight():
    with envd.make("CartPole-v1", NUM_ENVS, seed=0, num_threads=1) as env:
        env.async_reset(seed=0)
        with pytest.raises(EnvStateError):
            env.step_in_place()
        env.recv()


@pytest.mark.parametrize("transport,fast_path", [("shm", False), ("shm", True),
                                                 ("inline", False)])
def test_in_place_through_the_daemon_equals_step_in_process(daemon, transport, fast_path):
    """The client's in-place step: its actions buffer is the session's
    (shared memory, or sent inline); the daemon checks its own copy."""
    with envd.make("CartPole-v1", NUM_ENVS, seed=3, num_threads=0) as local:
        actions = _actions(local)
        expected = _by_step(local, actions)
        bad = actions[0].copy()
        bad[1] = 5  # (the bad action's error, compared below)
        with pytest.raises(InvalidActionError) as by_step:
            local.step(bad)
    with daemon.connect() as client:
        with client.make("CartPole-v1", NUM_ENVS, seed=3, transport=transport,
                         fast_path=fast_path) as remote:
            got, ended = _in_place(remote, actions)
            assert ended > 0
            remote.reset(seed=3)
            remote.actions[...] = bad
            before = remote.observations.copy()
            with pytest.raises(InvalidActionError) as in_place:
                remote.step_in_place()
            assert str(in_place.value) == str(by_step.value)
            assert np.array_equal(remote.observations, before)  # (no env stepped)
            remote.actions[1] = 0
            remote.step_in_place()  # the session goes on
    for k, (x, y) in enumerate(zip(got, expected)):
        assert_same(x, y, f"{transport} fast_path={fast_path} step {k}")


def test_step_takes_an_equal_dtype_that_is_another_object():
    """step()'s fast path tests the actions' dtype by identity first: an
    equal dtype that is another object (an unpickled one) steps as the same."""
    other = pickle.loads(pickle.dumps(np.dtype(np.int64)))
    assert np.zeros(1, np.int64).view(other).dtype is not np.dtype(np.int64)
    assert other == np.dtype(np.int64)
    with envd.make("CartPole-v1", NUM_ENVS, seed=0) as a, \
            envd.make("CartPole-v1", NUM_ENVS, seed=0) as b:
        a.reset(seed=0)
        b.reset(seed=0)
        for k in range(20):
            actions = np.arange(NUM_ENVS, dtype=np.int64) % 2 ^ (k % 2)
            assert_same(a.step(actions.view(other))[:4], b.step(actions)[:4], f"step {k}")


@pytest.mark.parametrize("in_place", [False, True])
def test_step_info_after_a_step_that_failed_describes_no_step(in_place):
    """A step that raises after envs may have stepped (an env's own error)
    leaves step_info() nothing to describe: it refuses, as after a reset,
    instead of describing the step before over buffers the failed one wrote."""
    actions = np.zeros(2, np.int64)
    with envd.make(failing_creator(1, at_step=2), 2, num_workers=0) as env:
        env.reset(seed=0)  # env 1 gets seed 1: its 2nd step raises
        env.step(actions)
        env.step_info()  # (describes that step)
        with pytest.raises(envd.EnvError, match="boom at step 2"):
            if in_place:
                env.actions[...] = actions
                env.step_in_place()
            else:
                env.step(actions)
        with pytest.raises(EnvStateError, match="step_info"):
            env.step_info()


@pytest.mark.parametrize("env_id, kwargs", [("CartPole-v1", {"num_threads": 0}),
                                            ("CartPole-v1", {"num_threads": 1}),
                                            ("py:CartPole-v1", {"num_workers": 0})])
def test_a_dropped_env_is_freed_at_once(env_id, kwargs):
    """The step paths' step function and its argument (the native step and
    the session's handle) hold no reference back to the env: an env dropped
    without close() is freed at once, its envs and threads with it, with no
    garbage collector."""
    gc.disable()
    try:
        env = envd.make(env_id, NUM_ENVS, seed=0, **kwargs)
        env.reset(seed=0)
        env.step_in_place()
        env.step(env.actions.copy())
        env.close()  # (closing binds the closed error: no reference back either)
        alive = weakref.ref(env)
        del env
        assert alive() is None
        env = envd.make(env_id, NUM_ENVS, seed=0, **kwargs)
        env.reset(seed=0)
        env.step_in_place()
        alive = weakref.ref(env)
        del env
        assert alive() is None
    finally:
        gc.enable()


def test_a_refused_in_place_step_gives_the_env_back():
    """Every way step_in_place() is refused (in flight, a bad action, another
    thread's call) leaves the env usable at once by the next call."""
    with envd.make("CartPole-v1", NUM_ENVS, seed=0, num_threads=1) as env:
        env.async_reset(seed=0)
        with pytest.raises(EnvStateError, match="wait for recv"):
            env.step_in_place()
        env.recv()  # (the env was given back: recv is not "in use")
        env.reset(seed=0)
        env.actions[...] = 0
        env.actions[1] = 9
        with pytest.raises(InvalidActionError):
            env.step_in_place()
        env.actions[1] = 1
        assert env.step_in_place() == 0
        env._claim.pop()  # another thread's call in progress
        try:
            with pytest.raises(EnvStateError, match="another thread"):
                env.step_in_place()
            with pytest.raises(EnvStateError, match="another thread"):
                env.step(env.actions.copy())
        finally:
            env._claim.append(True)
        assert env.step_in_place() == 0
