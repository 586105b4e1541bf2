"""The async books a daemon-served env keeps (client/transports/books.py):
the rules of envd.stepping, checked without a daemon."""
from __future__ import annotations

import numpy as np
import pytest

from envd.client.transports.books import AsyncBooks
from envd.errors import EnvStateError, InvalidActionError


def ids(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


def test_ready_envs_come_back_oldest_first_exactly_once():
    books = AsyncBooks("E", 6)
    books.sent(ids(0, 1, 2))
    books.sent(ids(3, 4))
    books.finished(ids(3, 4))  # the second batch finished first
    books.finished(ids(0, 1, 2))
    assert books.pop(3).tolist() == [3, 4, 0]
    assert books.pop(2).tolist() == [1, 2]
    assert (books.num_ready, books.num_in_flight, books.active) == (0, 0, False)


def test_an_env_not_idle_cannot_be_sent_and_names_its_state():
    books = AsyncBooks("E", 4)
    books.sent(ids(1))
    with pytest.raises(EnvStateError, match="env 1 is in flight"):
        books.check_sendable(ids(0, 1))
    books.finished(ids(1))
    with pytest.raises(EnvStateError, match="env 1 is ready"):
        books.check_sendable(ids(1))
    books.check_sendable(ids(0, 2, 3))


def test_step_and_reset_are_refused_while_envs_are_out():
    books = AsyncBooks("E", 4)
    books.all_ready()
    with pytest.raises(EnvStateError, match="wait for recv"):
        books.check_idle("step")
    books.pop(2)
    books.sent(ids(0))
    with pytest.raises(EnvStateError, match="reset\\(\\) while 1 envs are in flight"):
        books.check_idle("reset")
    books.finished(ids(0))
    books.check_idle("reset")  # a reset forgets the ready ones
    assert not books.active
    books.check_sendable(ids(0, 1, 2, 3))


def test_a_refused_send_makes_its_envs_idle_and_waits_for_the_next_recv():
    books = AsyncBooks("E", 4)
    books.sent(ids(0, 1))
    books.refused(ids(0, 1), InvalidActionError("refused"))
    assert books.num_in_flight == 0
    books.check_sendable(ids(0, 1))  # idle again
    with pytest.raises(InvalidActionError, match="refused"):
        books.check_recv(1)  # the refusal explains the short recv
    with pytest.raises(EnvStateError, match="only 0 are in flight or ready"):
        books.check_recv(1)  # reported once


def test_after_an_async_reset_every_env_is_ready_in_env_order():
    books = AsyncBooks("E", 3)
    books.sent(ids(2))
    books.error = EnvStateError("dropped with the results")
    books.all_ready()
    assert books.error is None and books.pop(3).tolist() == [0, 1, 2]
