"""The in-process step's bound call (envd.native._envd_call, native/capi/bound_call.c;
NativeSession.bare_step): the same trajectories as cffi's call of
envd_session_step; the GIL held through a step measured short and released
for a long one (another Python thread progresses meanwhile); refused after
close, also when close() races threads stepping in a loop; bad arguments
refused."""
from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pytest
from support.daemon import wait_until

import envd
from envd.native._envd_call import Bound, call
from envd.native._envd_native import ffi, lib

STEPS = 120
#: envs whose whole step is far above ENVD_SESSION_SHORT_STEP_NS (20 us) on
#: any machine: CartPole costs tens of ns an env
LONG_N = 50_000


def _short(env) -> bool:
    return bool(lib.envd_session_step_is_short(env._native.handle))


@pytest.mark.parametrize(("env_id", "num_envs", "num_threads"),
                         [("CartPole-v1", 1, 0), ("CartPole-v1", 64, 0), ("Acrobot-v1", 4, 1),
                          ("CartPole-v1", LONG_N, 1)])
def test_trajectories_equal_cffis_call(env_id, num_envs, num_threads):
    """Env A stepped by step() and step_in_place() (the bound call), env B by
    cffi's envd_session_step on its handle, same seeds and actions: every
    observation, reward, termination and truncation bit-identical."""
    rng = np.random.default_rng(0)
    with envd.make(env_id, num_envs, seed=5, num_threads=num_threads) as a, \
            envd.make(env_id, num_envs, seed=5, num_threads=num_threads) as b:
        obs_a, _ = a.reset(seed=5)
        obs_b, _ = b.reset(seed=5)
        np.testing.assert_array_equal(obs_a, obs_b)
        assert a._step_fn is call and isinstance(a._step_arg, Bound)
        ways = set()
        for t in range(STEPS):
            actions = rng.integers(0, a.single_action_space.n, num_envs)
            ways.add(_short(a))
            b.actions[...] = actions
            done_b = lib.envd_session_step(b._native.handle)
            assert done_b >= 0
            if t % 2:
                a.actions[...] = actions
                assert a.step_in_place() == done_b  # (the episodes that ended)
            else:
                a.step(actions)
            for name in ("observations", "rewards", "terminations", "truncations"):
                np.testing.assert_array_equal(getattr(a, name), getattr(b, name),
                                              err_msg=f"{name} at step {t}")
        # The first step is unmeasured: released.  A step of LONG_N envs is
        # never short (20 us is under half a nanosecond an env); one of a
        # single env always is, once measured (a few hundred ns at most: a
        # fiftyfold margin for a loaded machine).  Between them it
        # depends on the machine: either way gives the same trajectory.
        assert False in ways
        if num_envs == LONG_N:
            assert ways == {False}
        if num_envs == 1:
            assert True in ways


def test_is_short_follows_the_measured_cost():
    """0 before any step was measured and for a long step, 1 for a short one;
    1 for a NULL session (whose step is refused at once)."""
    with envd.make("CartPole-v1", 4, seed=0) as small, \
            envd.make("CartPole-v1", LONG_N, seed=0) as large:
        for env in (small, large):
            env.reset(seed=0)
            assert not _short(env)  # (a reset times no step)
            for _ in range(20):
                env.step(np.zeros(env.num_envs, np.int64))
        assert _short(small) and not _short(large)
    assert lib.envd_session_step_is_short(ffi.NULL) == 1


def _progress_during_steps(env, steps: int, until_progress: bool) -> int:
    """How many of env's in-place steps let another Python thread run while
    they stepped.  The other thread counts in a loop that yields the GIL at
    every turn (time.sleep(0)); the switch interval is made huge, so that it
    gets the GIL back only when this thread releases it: a count that moved
    across one step_in_place() (this thread runs nothing else meanwhile)
    means the step released the GIL.  until_progress: stop at the first
    such step (a released step lets the other thread in only if it is
    waiting for the GIL by then: a loaded machine may take a few steps)."""
    count, stop = [0], threading.Event()

    def counter():
        while not stop.is_set():
            count[0] += 1
            time.sleep(0)  # (yields the GIL)

    thread = threading.Thread(target=counter, daemon=True)
    thread.start()
    wait_until(lambda: count[0] > 0, what="the counting thread counting")
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    progressed = 0
    try:
        for _ in range(steps):
            before = count[0]
            env.step_in_place()
            if count[0] != before:
                progressed += 1
                if until_progress:
                    break
    finally:
        sys.setswitchinterval(interval)
        stop.set()
        thread.join(timeout=60)
        assert not thread.is_alive()
    return progressed


@pytest.mark.parametrize("num_threads", [0, 1])
def test_a_long_step_releases_the_gil(num_threads):
    with envd.make("CartPole-v1", LONG_N, seed=0, num_threads=num_threads) as env:
        env.reset(seed=0)
        env.step_in_place()  # measured from now on
        assert not _short(env)
        # (a bound of steps, not of time: each takes a millisecond or more)
        assert _progress_during_steps(env, 2000, until_progress=True) == 1


def test_a_short_step_keeps_the_gil():
    """The control of the test above: the same check finds no progress while
    every step holds the GIL (so the test above shows the release)."""
    with envd.make("CartPole-v1", 4, seed=0) as env:
        env.reset(seed=0)
        for _ in range(20):
            env.step_in_place()
        assert _short(env)
        assert _progress_during_steps(env, 200, until_progress=False) == 0


def test_refused_after_close():
    """A bound step kept past close() is refused (ENVD_EINVAL: the bound
    handle is NULL), short or not; nothing freed is read."""
    env = envd.make("CartPole-v1", 8, seed=0)
    env.reset(seed=0)
    env.step_in_place()
    fn, bound = env._native.bare_step()
    assert fn(bound) >= 0 and not bound.cleared
    env.close()
    assert bound.cleared
    for _ in range(2):
        assert fn(bound) == lib.ENVD_EINVAL
    with pytest.raises(envd.EnvStateError, match="closed"):
        env.step_in_place()


@pytest.mark.parametrize("num_envs", [64, LONG_N])
def test_close_racing_step_loops(num_envs):
    """Two threads step in place back to back (short steps hold the GIL, long
    ones release it), a third closes: each loop ends with the closed error,
    close() returns, and the bound call refuses from then on."""
    env = envd.make("CartPole-v1", num_envs, seed=0, num_threads=1)
    env.reset(seed=0)
    fn, bound = env._native.bare_step()
    calls, errors = [0, 0], []

    def loop(k):
        while True:
            calls[k] += 1
            try:
                env.step_in_place()
            except envd.EnvStateError as exc:  # in use by the other, or closed
                if "closed" in str(exc):
                    errors.append(exc)
                    return
                assert "another thread" in str(exc)

    threads = [threading.Thread(target=loop, args=(k,), daemon=True) for k in range(2)]
    for thread in threads:
        thread.start()
    wait_until(lambda: min(calls) >= 5, what="both loops calling")
    closer = threading.Thread(target=env.close, daemon=True)
    closer.start()
    closer.join(timeout=120)
    assert not closer.is_alive() and env.closed
    for thread in threads:
        thread.join(timeout=60)
        assert not thread.is_alive()
    assert len(errors) == 2
    assert fn(bound) == lib.ENVD_EINVAL


def test_bad_arguments_are_refused():
    with pytest.raises(TypeError, match="Bound"):
        call(object())
    with pytest.raises(ValueError, match="non-zero"):
        Bound(0, 0, 0)
    with pytest.raises(TypeError):
        Bound("step", 0, 0)
    with pytest.raises(TypeError):
        type("Sub", (Bound,), {})  # (call's exact type test relies on it)
