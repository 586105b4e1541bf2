"""Ctrl-C in the middle of a VecEnv's call leaves the env usable: the
one-call token (src/envd/vector_base.py, the claim) is neither lost -- after
which every call said "used by another thread" and close() waited forever --
nor doubled.  A timer interrupts the env's own methods thousands of times at
arbitrary points (its signal handler raises KeyboardInterrupt only while one
of vector_base.py's frames runs, so the test's loop itself is never cut); the
window of the lost token, between taking it and the ``try`` that gives it
back, was a few bytecodes: hit within tens of interrupts."""
from __future__ import annotations

import signal
import time

import numpy as np
import pytest

import envd
from envd import vector_base
from envd.errors import EnvStateError

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
    tokens = len(env._claim)
    if tokens == 0:
        env._claim.append(True)  # (so that close() returns)
    env.close()
    assert not token_lost and tokens == 1, (
        f"after {interrupts} interrupts in {calls} calls the env holds {tokens} tokens")
    assert interrupts >= 100, f"only {interrupts} interrupts in {DEADLINE_S} s"
