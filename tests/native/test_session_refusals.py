"""NativeSession's refusals name their cause even when the envs that caused
them finished meanwhile (the counts it reads come after the refusal)."""
from __future__ import annotations

import numpy as np
import pytest
from test_native_session import make_session

import envd
from envd.errors import EnvStateError
from envd.native._envd_native import lib


def test_a_reset_refused_for_envs_in_flight_that_finished_since_says_so():
    """The interleaving, made deterministic: the session refused reset
    (ENVD_EBUSY, no env named) while a batch was in flight, and by the time
    the wrapper counts the envs that batch has finished (its envs ready, none
    in flight).  Before, this fell through to NativeError 'resource busy'
    (seen 1 time in 3 for send then reset() with the default threads)."""
    session, _ = make_session(4, None)
    try:
        session.async_reset(False)  # every env ready, none in flight
        assert session.counts() == (0, 4)
        refusal = session._refusal(lib.ENVD_EBUSY, "reset")
        assert isinstance(refusal, EnvStateError)
        assert "reset() while" in str(refusal) and "in flight" in str(refusal)
    finally:
        session.close()


@pytest.mark.parametrize("num_threads", [0, 1, None])
def test_send_then_reset_is_an_env_state_error_or_allowed(num_threads):
    """Whatever the threads: reset() right after a send is refused with
    EnvStateError (the batch is in flight) or, its batch already finished,
    forgets the ready envs; never another error."""
    for _ in range(30):
        with envd.make("CartPole-v1", 4, seed=0, batch_size=2, num_threads=num_threads) as env:
            env.async_reset(seed=0)
            ids = env.recv()[4]["env_id"]
            env.send(np.ones(2, np.int64), ids)
            try:
                env.reset()
            except EnvStateError as exc:
                assert "reset() while" in str(exc) and "in flight" in str(exc)
