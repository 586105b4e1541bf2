"""The in-process step's bound call (envd.native._envd_call, native/capi/bound_call.c;
NativeSession.bare_step): the same trajectories as cffi's call of
envd_session_step; the GIL held through a step measured short and released
for a long one (another Python thread progresses meanwhile); refused after
close, also when close() races threads stepping in a loop; bad arguments
refused.  A short step never waits for the session's lock holding the GIL (a
thread holding that lock across a GIL release), and a forced chunk (every
step on the pool) releases it; a hosted session's bare step releases it
always."""
from __future__ import annotations

import subprocess
import sys
import textwrap
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
#: envd_session_step_if_short's "not run" (session.h's ENVD_SESSION_NOT_RUN, INT_MIN)
NOT_RUN = -2**31


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
    assert lib.envd_session_step_if_short(ffi.NULL) == lib.ENVD_EINVAL


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


#: A thread takes the session's lock (as server/sessions.py's locked() does)
#: and releases the GIL while holding it; the main thread then steps in
#: place, short.  A short step that waited for the lock holding the GIL would
#: deadlock both: the holder needs the GIL to unlock.  faulthandler ends a
#: deadlocked run (the test's subprocess) with its stacks.
_LOCK_HOLDER = textwrap.dedent("""
    import faulthandler, threading, time, envd
    from envd.native._envd_native import lib
    env = envd.make("CartPole-v1", 4, seed=0, num_threads=0)
    env.reset(seed=0)
    for _ in range(20):
        env.step_in_place()
    assert lib.envd_session_step_is_short(env._native.handle)
    session, held = env._native, threading.Event()
    def holder():
        session.lock()
        held.set()
        time.sleep(0.5)  # (releases the GIL, the session's lock held)
        session.unlock()
    thread = threading.Thread(target=holder)
    thread.start()
    held.wait()
    faulthandler.dump_traceback_later(60, exit=True)
    before = lib.envd_session_steps(session.handle)
    env.step_in_place()
    assert lib.envd_session_steps(session.handle) == before + 1
    thread.join()
    faulthandler.cancel_dump_traceback_later()
    env.close()
    print("stepped")
""")


def test_a_short_step_never_waits_for_the_lock_holding_the_gil():
    proc = subprocess.run([sys.executable, "-c", _LOCK_HOLDER], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and "stepped" in proc.stdout, proc.stderr[-4000:]


def test_a_forced_chunk_releases_the_gil():
    """With a forced chunk every step runs on the pool: never short, so the
    bound call's first half (envd_session_step_if_short, which runs a short
    step holding the GIL) runs nothing and the step runs with the GIL
    released; back to adaptive dispatch, short again.  (The GIL's release
    itself is not observed here: a pooled step of 4 CartPoles is too quick
    for another thread to take the GIL meanwhile, which is what
    test_a_long_step_releases_the_gil observes.)"""
    with envd.make("CartPole-v1", 4, seed=0, num_threads=1) as env:
        handle = env._native.handle
        env.reset(seed=0)
        for _ in range(20):
            env.step_in_place()
        assert _short(env)
        env.set_chunk_size(1)
        pooled = env.dispatch_stats()["pooled_jobs"]
        for _ in range(20):
            assert not _short(env)
            steps = lib.envd_session_steps(handle)
            assert lib.envd_session_step_if_short(handle) == NOT_RUN
            assert lib.envd_session_steps(handle) == steps
            env.step_in_place()
        assert env.dispatch_stats()["pooled_jobs"] == pooled + 20
        env.set_chunk_size(None)
        for _ in range(20):
            env.step_in_place()
        assert _short(env)
        steps = lib.envd_session_steps(handle)
        assert lib.envd_session_step_if_short(handle) >= 0
        assert lib.envd_session_steps(handle) == steps + 1


@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_hosted_sessions_bare_step(num_workers):
    """A hosted session's bare step (its envs are Python's: always released):
    the episodes that ended, the same trajectory as step(); refused after
    close."""
    with envd.make("py:CartPole-v1", 2, seed=3, num_workers=num_workers) as a, \
            envd.make("py:CartPole-v1", 2, seed=3, num_workers=num_workers) as b:
        a.reset(seed=3)
        b.reset(seed=3)
        fn, bound = a._session.bare_step()  # (HostedVecEnv's session)
        assert fn is call and isinstance(bound, Bound)
        for _ in range(30):
            a.actions[...] = 1
            b.step(np.ones(2, np.int64))
            assert fn(bound) >= 0
            np.testing.assert_array_equal(a.observations, b.observations)
        a.close()
        assert bound.cleared and fn(bound) == lib.ENVD_EINVAL
