"""The in-process VecEnv as a gymnasium VectorEnv: views and copies, gymnasium
wrappers on top, lifecycle (no leaked threads), pinning, env listing."""
from __future__ import annotations

import gc
import os
import threading

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.wrappers.vector import NormalizeObservation, RecordEpisodeStatistics
from support.builtin_envs import BUILTIN_ENV_IDS, MULTI_AGENT_ENV_IDS, listed_builtins
from support.daemon import wait_until

import envd
from envd.stepping import NO_STEPPER


def task_count() -> int:
    return len(os.listdir("/proc/self/task"))


def test_list_envs_names_the_builtins():
    assert listed_builtins() == sorted(BUILTIN_ENV_IDS + MULTI_AGENT_ENV_IDS)


def test_is_a_gymnasium_vector_env():
    with envd.make("Pendulum-v1", 3, seed=0) as env:
        assert isinstance(env, gym.vector.VectorEnv)
        assert env.num_envs == 3
        assert env.metadata["autoreset_mode"] == gym.vector.AutoresetMode.NEXT_STEP
        obs, info = env.reset()
        assert obs.shape == (3, 3) and obs.dtype == np.float32 and info == {}
        assert env.observation_space.contains(obs)
        obs, rew, term, trunc, info = env.step(env.action_space.sample())
        assert (rew.dtype, term.dtype, trunc.dtype) == (np.float32, np.bool_, np.bool_)


def test_returned_arrays_are_views_overwritten_by_the_next_step():
    with envd.make("CartPole-v1", 4, seed=0) as env:
        obs, _ = env.reset()
        kept = obs.copy()
        obs2 = env.step(np.ones(4, np.int64))[0]
        assert obs2 is obs or np.shares_memory(obs, obs2)
        assert obs.tobytes() != kept.tobytes()


def test_copy_option_returns_independent_arrays():
    with envd.make("CartPole-v1", 4, seed=0, copy=True) as env:
        obs, _ = env.reset()
        first = env.step(np.ones(4, np.int64))
        second = env.step(np.ones(4, np.int64))
        for a, b in zip(first[:4], second[:4]):
            assert not np.shares_memory(a, b)
        assert first[0].tobytes() != second[0].tobytes()
        infos = []
        while len(infos) < 2:
            info = env.step(np.ones(4, np.int64))[4]
            if info:
                infos.append(info)
        for key in "rlt":
            assert not np.shares_memory(infos[0]["envd_episode"][key],
                                        infos[1]["envd_episode"][key])
        assert not np.shares_memory(infos[0]["_envd_episode"], infos[1]["_envd_episode"])


def test_info_arrays_are_views_by_default():
    with envd.make("CartPole-v1", 4, seed=0) as env:
        env.reset()
        infos = []
        while len(infos) < 2:
            info = env.step(np.ones(4, np.int64))[4]
            if info:
                infos.append(info)
        assert np.shares_memory(infos[0]["envd_episode"]["r"], infos[1]["envd_episode"]["r"])


def test_episode_statistics_match_gymnasium_wrapper_on_top_of_envd():
    """gymnasium's own RecordEpisodeStatistics, wrapped around a default envd
    env, works (envd's statistics are under info["envd_episode"], the wrapper's
    under info["episode"]) and both report the same returns and lengths."""
    num_envs = 16
    wrapped = RecordEpisodeStatistics(envd.make("CartPole-v1", num_envs, seed=4))
    wrapped.reset()
    rng = np.random.default_rng(0)
    episodes = 0
    for _ in range(400):
        *_, info = wrapped.step(rng.integers(0, 2, num_envs))
        assert ("envd_episode" in info) == ("episode" in info)
        if "episode" in info:
            ours, theirs = info["envd_episode"], info["episode"]
            np.testing.assert_array_equal(info["_envd_episode"], info["_episode"])
            np.testing.assert_array_equal(ours["r"], theirs["r"])
            np.testing.assert_array_equal(ours["l"], theirs["l"])
            # wall times agree to within scheduling noise
            assert np.all(np.abs(ours["t"] - theirs["t"]) < 1.0)
            episodes += int(info["_episode"].sum())
    assert episodes > 16
    wrapped.close()


def test_episode_statistics_under_gymnasium_key_conflict_with_the_wrapper():
    """episode_statistics="episode" (gymnasium's key, for code that reads it
    without the wrapper) fills info["episode"] itself, so gymnasium's wrapper
    on top fails with gymnasium's own message naming the key, not silently."""
    with envd.make("CartPole-v1", 2, seed=0, episode_statistics="episode") as env:
        env.reset()
        for _ in range(200):
            *_, info = env.step(np.ones(2, np.int64))
            if info:
                break
        assert set(info) == {"episode", "_episode"} and info["episode"].keys() == {"r", "l", "t"}
    wrapped = RecordEpisodeStatistics(envd.make("CartPole-v1", 2, seed=0,
                                                episode_statistics="episode"))
    wrapped.reset()
    with pytest.raises(ValueError, match="'episode'"):
        for _ in range(200):
            wrapped.step(np.ones(2, np.int64))
    wrapped.close()


@pytest.mark.parametrize("value", ["", "_episode", "env_id", "final_obs", "not an id", 1, None])
def test_bad_episode_statistics_key_is_refused(value):
    with pytest.raises(envd.InvalidArgumentError, match="episode_statistics must be"):
        envd.make("CartPole-v1", 2, episode_statistics=value)


def test_episode_statistics_key_cannot_hide_an_env_info_field():
    with pytest.raises(envd.InvalidArgumentError, match="info field 'action_mask'"):
        envd.make("ConnectFour-v0", 2, episode_statistics="action_mask")


def test_other_gymnasium_vector_wrappers_work():
    env = NormalizeObservation(envd.make("Acrobot-v1", 8, seed=0))
    env.reset()
    for _ in range(20):
        obs, *_ = env.step(env.action_space.sample())
    assert obs.shape == (8, 6) and np.isfinite(obs).all()
    env.close()


def test_max_episode_steps_one_truncates_every_step():
    with envd.make("MountainCar-v0", 3, seed=0, max_episode_steps=1) as env:
        env.reset()
        for step in range(6):
            _, rew, term, trunc, info = env.step(np.zeros(3, np.int64))
            if step % 2 == 0:  # a real step: truncated by the limit
                assert trunc.all() and info["envd_episode"]["l"].tolist() == [1, 1, 1]
            else:  # next_step autoreset: reward 0, nothing done
                assert not trunc.any() and (rew == 0).all() and info == {}


def test_threads_are_released_on_close_and_on_garbage_collection():
    gc.collect()  # envs of earlier tests
    baseline = task_count()
    envs = [envd.make("CartPole-v1", 64, num_threads=3) for _ in range(5)]
    assert task_count() == baseline + 15
    for env in envs[:3]:
        env.close()
    del envs  # the last two are closed by garbage collection
    gc.collect()
    assert task_count() == baseline


@pytest.mark.parametrize("env_id, num_workers", [("CartPole-v1", None), ("py:CartPole-v1", 1)])
def test_close_drops_the_stepper_and_every_call_is_refused(env_id, num_workers):
    """close() drops the VecEnv's session for NO_STEPPER (built-in and hosted
    envs alike); a closed env refuses every call before reaching it, and
    NO_STEPPER itself refuses too."""
    kwargs = {} if num_workers is None else {"num_workers": num_workers}
    env = envd.make(env_id, 2, seed=0, **kwargs)
    env.reset()
    session = env._stepper
    assert session is not NO_STEPPER
    env.close()
    assert env._stepper is NO_STEPPER
    actions = np.zeros(2, np.int64)
    bad = np.full(2, 7, np.int64)  # (closed is said first, before any action is looked at)
    for call in (env.reset, lambda: env.step(actions), lambda: env.step(bad),
                 env.step_in_place, lambda: env.send(actions, np.arange(2)), env.recv):
        with pytest.raises(envd.EnvStateError, match="closed"):
            call()
    for call in (lambda: NO_STEPPER.reset(False, False), lambda: NO_STEPPER.async_reset(False),
                 NO_STEPPER.step, lambda: NO_STEPPER.send(np.arange(2)),
                 lambda: NO_STEPPER.recv(1), lambda: NO_STEPPER.render(np.zeros((2, 1, 1, 3), np.uint8))):
        with pytest.raises(envd.EnvStateError, match="no envs to step"):
            call()
    NO_STEPPER.close()  # (nothing to free: idempotent, as a Stepper's close)


def test_envs_step_concurrently_from_python_threads():
    """The native step releases the GIL; envs used from different Python
    threads at once give the same results as alone."""
    def run(seed, out):
        with envd.make("Acrobot-v1", 32, seed=seed, num_threads=1) as env:
            env.reset()
            actions = np.random.default_rng(seed).integers(0, 3, (200, 32))
            out[seed] = b"".join(env.step(a)[0].tobytes() for a in actions)

    alone, together = {}, {}
    for seed in range(3):
        run(seed, alone)
    threads = [threading.Thread(target=run, args=(seed, together)) for seed in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert together == alone


def test_pinning_workers():
    cpus = sorted(os.sched_getaffinity(0))
    with envd.make("CartPole-v1", 256, seed=0, num_threads=1, pin_cpus=cpus[-1:]) as env:
        env.reset()
        env.set_chunk_size(16)
        env.step(np.zeros(256, np.int64))
    with pytest.raises(envd.InvalidArgumentError, match="pin_cpus"):
        envd.make("CartPole-v1", 4, num_threads=2, pin_cpus=cpus[:1])
    with pytest.raises(envd.InvalidArgumentError, match="pin_cpus"):
        envd.make("CartPole-v1", 4, num_threads=1, pin_cpus=[10_000])


def test_cli_lists_envs(capsys):
    from envd.tools.cli import main
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for env_id in BUILTIN_ENV_IDS:
        assert env_id in out
    assert "g (float" in out


def test_a_masked_first_reset_seeds_every_env_from_make():
    """Each env owns its seed + i generator from make on: envs outside the mask
    of a first reset start, when they are reset later, exactly where a full
    first reset would have started them (as gymnasium's reset(seed=...))."""
    ref = gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode="sync")
    expected = ref.reset(seed=123)[0]
    with envd.make("CartPole-v1", 3, seed=123) as env:
        first = env.reset(options={"reset_mask": np.array([True, False, False])})[0].copy()
        assert first[0].tobytes() == expected[0].tobytes()
        later = env.reset(options={"reset_mask": np.array([False, True, True])})[0]
        assert later[1:].tobytes() == expected[1:].tobytes()
    ref.close()


def test_max_episode_steps_zero_means_no_time_limit():
    with envd.make("Pendulum-v1", 2, seed=0, max_episode_steps=0) as env:
        assert env.max_episode_steps is None
        env.reset()
        for _ in range(450):  # past Pendulum's registered limit of 200
            _, _, term, trunc, _ = env.step(np.zeros((2, 1), np.float32))
            assert not (term | trunc).any()


def test_close_waits_until_the_call_in_progress_gives_the_env_back():
    """close() from another thread returns only once the call holding the
    env gives it back (here the test holds it, as a call would), then every
    call says closed."""
    env = envd.make("CartPole-v1", 4, seed=0)
    env.reset(seed=0)
    env._claim.pop()  # a call in progress
    closer = threading.Thread(target=env.close)
    try:
        closer.start()
        wait_until(lambda: env._closing, what="close() began")  # (an event, not a duration)
        assert closer.is_alive() and not env.closed  # (it cannot end while the env is held)
        assert env._native is not None  # (nothing freed under the holder)
    finally:
        env._claim.append(True)
    closer.join(timeout=60)
    assert not closer.is_alive() and env.closed
    with pytest.raises(envd.EnvStateError, match="closed"):
        env.step_in_place()


@pytest.mark.parametrize("in_place", [False, True])
def test_close_ends_threads_stepping_in_a_loop(in_place):
    """Threads stepping back to back give the env back between two calls
    without letting another thread run (the GIL): close() from a third
    thread must not wait for such a moment.  It makes every later call
    refuse, so each loop ends at its next call with the closed error: a
    step or two at most once close() began (the one in progress), not the
    thousands a close() that waits for a gap between calls lets through."""
    env = envd.make("CartPole-v1", 64, seed=0, num_threads=1)
    env.reset(seed=0)
    actions = np.zeros(env.num_envs, np.int64)
    closing = threading.Event()
    calls, after_close_began, errors = [0, 0], [0, 0], []

    def loop(k):
        while True:
            calls[k] += 1
            try:
                if in_place:
                    env.step_in_place()
                else:
                    env.step(actions)
            except envd.EnvStateError as exc:  # in use by the other, or closed
                if "closed" in str(exc):
                    errors.append(exc)
                    return
                assert "another thread" in str(exc)
                continue
            if closing.is_set():
                after_close_began[k] += 1

    def close():
        closing.set()
        env.close()

    threads = [threading.Thread(target=loop, args=(k,), daemon=True) for k in range(2)]
    for thread in threads:
        thread.start()
    # both loops running (one may only ever find the env in use: the other
    # takes it back between its calls)
    wait_until(lambda: min(calls) >= 50, what="both loops calling")
    closer = threading.Thread(target=close, daemon=True)
    closer.start()
    closer.join(timeout=120)
    assert not closer.is_alive() and env.closed
    for thread in threads:
        thread.join(timeout=60)
        assert not thread.is_alive()
    assert len(errors) == 2  # each loop ended by the closed error
    assert sum(after_close_began) <= 10, after_close_began


@pytest.mark.parametrize("in_place", [False, True])
def test_a_second_thread_gets_a_clear_error_and_close_waits(in_place):
    """One call at a time: a step racing another thread's step raises
    EnvStateError; close() from another thread waits for the step in progress
    (step(), or step_in_place(): the bare native call) instead of freeing
    memory under it."""
    env = envd.make("Acrobot-v1", 200_000, seed=0, num_threads=1)
    env.reset()
    actions = np.zeros(env.num_envs, np.int64)
    started, errors = threading.Event(), []

    def stepper():
        started.set()
        try:
            for _ in range(3):
                if in_place:
                    env.step_in_place()
                else:
                    env.step(actions)
        except envd.EnvStateError as exc:  # in use, or closed under us
            errors.append(exc)

    thread = threading.Thread(target=stepper)
    thread.start()
    started.wait(timeout=60)
    for _ in range(3):
        try:
            env.step(actions)
        except envd.EnvStateError as exc:
            errors.append(exc)
    env.close()  # must wait for a step in progress, not free memory under it
    thread.join(timeout=300)
    assert not thread.is_alive()
    for exc in errors:
        assert "another thread" in str(exc) or "closed" in str(exc)
    with pytest.raises(envd.EnvStateError, match="closed"):
        env.step(actions)
