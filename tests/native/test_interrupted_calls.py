"""Ctrl-C in the middle of a VecEnv's call leaves the env usable: the
one-call token (src/envd/vector_base.py, the claim) is neither lost -- after
which every call said "used by another thread" and close() waited forever --
nor doubled.  A timer interrupts the env's own methods thousands of times at
arbitrary points (its signal handler raises KeyboardInterrupt only while one
of vector_base.py's frames runs, so the test's loop itself is never cut); the
window of the lost token, between taking it and the ``try`` that gives it
back, was a few bytecodes: hit within tens of interrupts.

Under a tracer (pdb, IDE debuggers, coverage, profilers) an interrupt may
come before the pop or after the token was taken: the token is then never
doubled, and a lost one makes close() give up after a bound, leaking the
native session instead of freeing it under a call that may still run."""
from __future__ import annotations

import gc
import signal
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import envd
from envd import vector_base
from envd.errors import EnvStateError
from envd.native._envd_native import ffi

INTERRUPTS = 5000
DEADLINE_S = 120.0  # a loaded machine delivers the timer's signals late


def _interrupt_the_env(signum, frame):
    if frame is not None and frame.f_code.co_filename == vector_base.__file__:
        raise KeyboardInterrupt


@pytest.mark.skipif(not vector_base._INTERRUPTED_AFTER_POP,
                    reason="CPython 3.10 may raise the interrupt before the pop too: there "
                           "the token cannot be given back safely (vector_base.py)")
def test_interrupted_calls_never_lose_or_double_the_token():
    env = envd.make("CartPole-v1", 4, seed=0, num_threads=0)
    actions = np.zeros(4, dtype=np.int64)
    env.reset(seed=0)
    interrupts = calls = 0
    token_lost = False
    previous = signal.signal(signal.SIGALRM, _interrupt_the_env)
    # (pytest-timeout's alarm, if it set one: given back at the end, less
    # the time this test took, so that a hang here is still cut)
    started = time.monotonic()
    their_alarm = signal.getitimer(signal.ITIMER_REAL)[0]
    try:
        signal.setitimer(signal.ITIMER_REAL, 1e-4, 1e-4)
        deadline = time.monotonic() + DEADLINE_S
        while interrupts < INTERRUPTS and time.monotonic() < deadline:
            try:
                calls += 1
                if calls % 4 == 0:
                    env.step(actions)
                elif calls % 4 == 1:
                    env.step_info()
                else:
                    env.step_in_place()
            except KeyboardInterrupt:
                interrupts += 1
            except EnvStateError as error:  # (step_info after an interrupted step: no step)
                if "another thread" in str(error):  # nobody else uses it: the token is lost
                    token_lost = True
                    break
            if len(env._claim) != 1:
                break
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
        signal.signal(signal.SIGALRM, previous)
        if their_alarm > 0:
            signal.setitimer(signal.ITIMER_REAL,
                             max(their_alarm - (time.monotonic() - started), 1.0))
    tokens = len(env._claim)
    if tokens == 0:
        env._claim.append(True)  # (so that close() returns)
    env.close()
    assert not token_lost and tokens == 1, (
        f"after {interrupts} interrupts in {calls} calls the env holds {tokens} tokens")
    assert interrupts >= 100, f"only {interrupts} interrupts in {DEADLINE_S} s"


POP_LINES = {number for number, line in enumerate(
    Path(vector_base.__file__).read_text().splitlines(), start=1) if line.strip() == "claim.pop()"}


def _interrupt_at_the_pops_of(env):
    """A tracer (as pdb's or coverage's) whose code is interrupted by Ctrl-C
    at the line event of one of ``env``'s ``claim.pop()``: before the pop runs.

    Only ``env``'s own frames are cut: another env collected by the garbage
    collector during the call runs the same lines in its ``__del__``, and an
    interrupt there would be swallowed as unraisable -- and a tracer that
    raises is removed, so the call under test would then run untraced."""
    def tracer(frame, event, arg):
        if frame.f_code.co_filename != vector_base.__file__:
            return None
        if frame.f_locals.get("self") is not env:
            return None
        if event == "line" and frame.f_lineno in POP_LINES:
            raise KeyboardInterrupt
        return tracer
    return tracer


def _interrupted_under_the_tracer(env, call) -> None:
    previous = sys.gettrace()
    sys.settrace(_interrupt_at_the_pops_of(env))
    try:
        with pytest.raises(KeyboardInterrupt):
            call()
    finally:
        sys.settrace(previous)


def test_an_interrupt_before_the_pop_under_a_tracer_never_doubles_the_token():
    assert len(POP_LINES) >= 4  # (_acquire, step, step_in_place, close)
    env = envd.make("CartPole-v1", 4, seed=0, num_threads=0)
    env.reset(seed=0)
    actions = np.zeros(4, dtype=np.int64)
    try:
        for name, call in {"step": lambda: env.step(actions), "step_in_place": env.step_in_place,
                           "reset": env.reset, "close": env.close}.items():
            _interrupted_under_the_tracer(env, call)
            assert len(env._claim) == 1, f"{name}: {len(env._claim)} tokens after the interrupt"
            if name != "close":
                env.step(actions)  # (still usable)
        assert not env.closed
    finally:
        del env._claim[1:]  # (so that close() frees it once)
        env.close()
    assert env.closed and env._native is None


def test_the_tracer_cuts_only_its_env_when_another_is_collected_during_the_call():
    """The flake this guards against: a cyclic garbage env collected during
    the traced call ran ``claim.pop()`` in its ``__del__``; the interrupt there
    was swallowed and removed the tracer, so the call did not raise."""
    env = envd.make("CartPole-v1", 4, seed=0, num_threads=0)
    env.reset(seed=0)
    garbage = envd.make("CartPole-v1", 4, seed=0, num_threads=0)
    garbage.cycle = garbage  # (only the collector frees it)
    del garbage

    def step_after_a_collection() -> None:
        gc.collect()
        env.step(np.zeros(4, dtype=np.int64))

    try:
        _interrupted_under_the_tracer(env, step_after_a_collection)
        assert len(env._claim) == 1
    finally:
        env.close()


def test_close_gives_up_on_a_lost_token_and_leaks_instead_of_freeing(monkeypatch):
    """A token lost (as to an interrupt under a tracer after the pop): close()
    returns after _CLOSE_WAIT_S with a warning naming the env, and the native
    session stays alive (a call may still be in it); every call refuses."""
    monkeypatch.setattr(vector_base, "_CLOSE_WAIT_S", 0.2, raising=False)
    env = envd.make("CartPole-v1", 4, seed=0, num_threads=0)
    env.reset(seed=0)
    native = env._native
    env._claim.pop()  # the lost token
    caught: list[warnings.WarningMessage] = []

    def close() -> None:
        with warnings.catch_warnings(record=True) as found:
            warnings.simplefilter("always")
            env.close()
        caught.extend(found)

    closer = threading.Thread(target=close, daemon=True)
    closer.start()
    closer.join(timeout=60)  # (a generous deadline for a bound of 0.2 s)
    hung = closer.is_alive()
    try:
        assert not hung, "close() still waits for the lost token"
        # (the filter is the process's: a finalizer run meanwhile on any
        # thread -- an earlier test's unclosed file -- may warn too)
        leaks = [w for w in caught if w.category is RuntimeWarning]
        assert len(leaks) == 1, [str(w.message) for w in caught]
        assert "CartPole-v1" in str(leaks[0].message) and "leaked" in str(leaks[0].message)
        assert env.closed and env._native is native and native.handle != ffi.NULL
        assert env in vector_base._LEAKED
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            env.close()  # (idempotent: no second wait or warning)
    finally:
        env._claim.append(True)  # (as the call would at its end)
        closer.join()
    try:
        with pytest.raises(EnvStateError, match="closed"):
            env.step_in_place()
        assert native.handle != ffi.NULL
    finally:
        if env in getattr(vector_base, "_LEAKED", []):
            vector_base._LEAKED.remove(env)
        env._release()  # (the test knows no call runs: free it)


def test_garbage_collection_frees_an_env_whose_token_was_lost():
    """No call runs on an env being collected (its frame would hold the env):
    __del__ frees it at once, without close()'s wait or leak."""
    holder = [envd.make("CartPole-v1", 4, seed=0, num_threads=0)]
    native = holder[0]._native
    holder[0]._claim.pop()  # the lost token
    collector = threading.Thread(target=lambda: (holder.clear(), gc.collect()), daemon=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        collector.start()
        collector.join(timeout=60)
    assert not collector.is_alive(), "collecting the env waits for the lost token"
    assert native.handle == ffi.NULL

