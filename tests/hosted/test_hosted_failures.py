"""Failures of hosted Python envs: an env that raises becomes envd.EnvError
naming the env, the exception type and message; a worker that dies
(os._exit, a segfault, SIGKILL) makes the pending call raise; bad spaces and
ids are refused at make; nothing is left behind."""
from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from envs import FailsAfterDoneEnv, UnsupportedSpaceEnv, alive, failing_creator, wait_until

import envd


@pytest.mark.parametrize("num_workers", [0, 1, 3])
def test_exception_in_step_names_env_type_and_message(num_workers):
    env = envd.make(failing_creator(2, at_step=3), 4, num_workers=num_workers)
    try:
        env.reset(seed=0)
        for _ in range(2):
            env.step(np.zeros(4, np.int64))
        with pytest.raises(envd.EnvError) as raised:
            env.step(np.zeros(4, np.int64))
        assert raised.value.env_index == 2
        assert "env 2 raised ValueError: boom at step 3" in str(raised.value)
        assert isinstance(raised.value, envd.EnvdError)
        # the others stepped; the env is still usable after a reset (seed 10+)
        env.reset(seed=10)
        obs, *_ = env.step(np.zeros(4, np.int64))
        assert (obs[:, 0] == 1.0).all()
    finally:
        env.close()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_exception_in_reset(num_workers):
    env = envd.make(failing_creator(1, at_step=0), 2, num_workers=num_workers)
    try:
        with pytest.raises(envd.EnvError, match=r"env 1 raised ValueError: boom at step 0"):
            env.reset(seed=0)
    finally:
        env.close()


def test_exception_in_async_batch_reaches_recv():
    env = envd.make(failing_creator(1, at_step=1), 2, num_workers=2, batch_size=1)
    try:
        env.async_reset(seed=0)
        ids = [int(env.recv()[4]["env_id"][0]) for _ in range(2)]
        env.send(np.zeros(2, np.int64), np.array(ids))
        with pytest.raises(envd.EnvError, match="env 1 raised ValueError"):
            for _ in range(2):
                env.recv()
    finally:
        env.close()


@pytest.mark.parametrize("how", ["exit", "segfault"])
def test_dying_worker_fails_the_pending_call(how):
    env = envd.make(failing_creator(0, at_step=2, how=how), 4, num_workers=2)
    pids = env.worker_pids
    try:
        env.reset(seed=0)
        env.step(np.zeros(4, np.int64))
        with pytest.raises(envd.EnvError, match=r"worker 0 \(pid \d+, envs 0\.\.1\) died"):
            env.step(np.zeros(4, np.int64))
        with pytest.raises(envd.EnvError, match="died"):  # and every call after
            env.step(np.zeros(4, np.int64))
    finally:
        env.close()
    assert wait_until(lambda: not any(alive(p) for p in pids))


def test_killed_idle_worker_fails_the_next_call():
    env = envd.make("py:CartPole-v1", 4, num_workers=2)
    pids = env.worker_pids
    try:
        env.reset(seed=0)
        os.kill(pids[1], signal.SIGKILL)
        assert wait_until(lambda: not alive(pids[1]))
        with pytest.raises(envd.EnvError, match=r"worker 1 .* died"):
            env.step(np.zeros(4, np.int64))
    finally:
        env.close()
    assert wait_until(lambda: not any(alive(p) for p in pids))


def test_failing_constructor_is_reported_and_reclaimed():
    def creator():
        raise RuntimeError("no license")
    for workers in (0, 2):
        with pytest.raises(envd.EnvError, match="RuntimeError: no license"):
            envd.make(creator, 2, num_workers=workers)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_unsupported_space_is_named(num_workers):
    with pytest.raises(envd.InvalidArgumentError,
                       match=r"observation space at \['inner'\]\[1\] is Text"):
        envd.make(UnsupportedSpaceEnv, 2, num_workers=num_workers)


def test_bad_arguments():
    with pytest.raises(envd.UnknownEnvError, match="py:NoSuchEnv-v9"):
        envd.make("py:NoSuchEnv-v9", 2)
    with pytest.raises(envd.InvalidArgumentError, match="num_workers is for hosted Python envs"):
        envd.make("CartPole-v1", 2, num_workers=1)
    with pytest.raises(envd.InvalidArgumentError, match="num_threads"):
        envd.make("py:CartPole-v1", 2, num_threads=1)
    with pytest.raises(envd.InvalidArgumentError, match="num_workers"):
        envd.make("py:CartPole-v1", 2, num_workers=3)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_refused_steps_change_nothing(num_workers):
    """A step before the first reset, and a step of a done env in 'disabled'
    mode, are refused before any env steps (as for built-in envs)."""
    with envd.make("py:CartPole-v1", 3, num_workers=num_workers,
                   autoreset_mode="disabled") as env:
        with pytest.raises(envd.EnvStateError, match="env 0 was never reset"):
            env.step(np.zeros(3, np.int64))
        obs, _ = env.reset(seed=0)
        done = np.zeros(3, bool)
        while not done.any():
            obs, _, term, trunc, _ = env.step(np.ones(3, np.int64))
            done = term | trunc
        before = obs.copy()
        first = int(np.flatnonzero(done)[0])
        with pytest.raises(envd.EnvStateError, match=f"env {first} is done"):
            env.step(np.ones(3, np.int64))
        assert np.array_equal(env.step.__self__._obs, before)  # nothing stepped
        env.reset(options={"reset_mask": done})
        env.step(np.ones(3, np.int64))


@pytest.mark.parametrize("num_workers, mode, big_info", [
    (0, "same_step", False), (1, "same_step", False),  # the reset at once raised
    (1, "next_step", True), (1, "same_step", True), (1, "disabled", True)])  # the info (a slot)
def test_a_step_that_fails_after_ending_the_episode_leaves_the_env_needing_a_reset(
        num_workers, mode, big_info, tmp_path):
    """env.step ended the episode, then the worker failed (the same-step
    reset raised, or the info was too big to write): the step raises, and
    the env needs a reset -- the next step autoresets it (its episode
    counted from 0: return 3 over 3 steps, never two episodes merged), or
    under DISABLED is refused until a reset."""
    armed = str(tmp_path / "armed")
    env = envd.make(lambda: FailsAfterDoneEnv(armed, big_info), 1, num_workers=num_workers,
                    autoreset_mode=mode, episode_statistics=True)
    action = np.zeros(1, np.int64)
    try:
        env.reset(seed=0)
        open(armed, "w").close()
        env.step(action)
        env.step(action)
        with pytest.raises(envd.EnvError):
            env.step(action)
        if mode == "disabled":
            with pytest.raises(envd.EnvStateError):
                env.step(action)
            env.reset()
        elif mode == "next_step":
            obs, reward, term, trunc, _ = env.step(action)  # the autoreset step
            assert obs[0, 0] == 0 and reward[0] == 0 and not term[0]
        else:  # same_step: a reset the next step asks for (the failed one did not count)
            obs, reward, term, trunc, _ = env.step(action)
            assert obs[0, 0] == 0 and reward[0] == 0 and not term[0]
        episode = None
        for _ in range(3):
            obs, reward, term, trunc, info = env.step(action)
            episode = info.get("envd_episode", episode)
        assert term[0]
        assert episode is not None
        assert float(episode["r"][0]) == 3.0 and int(episode["l"][0]) == 3
    finally:
        env.close()
