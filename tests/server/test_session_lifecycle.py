"""A session's lifecycle (server/lifecycle.py) on its own: the transitions,
the one free, and the loud refusal of transitions it does not allow."""
from __future__ import annotations

import pytest

from envd.server.lifecycle import Lifecycle, LifecycleError, State


class Books:
    """The lifecycle's two callbacks, recorded."""

    def __init__(self) -> None:
        self.frees: list[bool] = []
        self.in_flight = False

    def lifecycle(self) -> Lifecycle:
        return Lifecycle("0123456789abcdef", free=self.frees.append,
                         outstanding=lambda: self.in_flight)


def test_open_busy_open_and_close_frees_once():
    books = Books()
    life = books.lifecycle()
    assert life.state is State.MAKING and not life.is_open
    life.open()
    life.begin("reset")
    assert life.state is State.BUSY and life.busy and life.operation == "reset" and life.is_open
    life.end()
    assert life.state is State.OPEN and not life.busy
    life.close()
    assert life.state is State.FREED and books.frees == [True]
    life.settle()
    life.shut_down()  # idempotent once freed
    assert books.frees == [True]


def test_a_close_while_busy_frees_when_the_operation_ends():
    books = Books()
    life = books.lifecycle()
    life.open()
    life.begin("step")
    life.close()
    assert life.state is State.CLOSING and life.operation == "step" and books.frees == []
    life.settle()  # the operation still runs
    assert books.frees == []
    life.end()
    assert life.state is State.FREED and books.frees == [True]


def test_a_close_with_batches_in_flight_waits_for_them_to_settle():
    books = Books()
    life = books.lifecycle()
    life.open()
    books.in_flight = True
    life.close()
    assert life.state is State.CLOSING and books.frees == []
    life.settle()
    assert books.frees == []
    books.in_flight = False
    life.settle()
    assert life.state is State.FREED and books.frees == [True]


def test_a_busy_close_with_batches_waits_for_both():
    books = Books()
    life = books.lifecycle()
    life.open()
    life.begin("recv")
    books.in_flight = True
    life.close()
    life.end()  # the recv was answered, a batch is still out
    assert life.state is State.CLOSING and books.frees == []
    books.in_flight = False
    life.settle()
    assert books.frees == [True]


def test_discard_and_shutdown():
    books = Books()
    made = books.lifecycle()
    made.discard()
    assert made.state is State.FREED and books.frees == [True]
    running = books.lifecycle()
    running.open()
    running.begin("reset")
    running.shut_down()
    assert running.state is State.FREED and books.frees == [True, False]  # not orderly


@pytest.mark.parametrize("steps, transition", [
    ((), "begin"),                     # MAKING: not in the books yet
    ((), "end"),
    ((), "close"),
    (("open",), "open"),
    (("open",), "end"),                # nothing runs
    (("open",), "discard"),
    (("open", "begin"), "begin"),      # one operation at a time
    (("open", "close"), "close"),      # freed
    (("open", "close"), "begin"),
    (("open", "close"), "end"),
    (("open", "begin", "close"), "close"),  # closing already
    (("open", "begin", "close"), "begin"),
])
def test_illegal_transitions_raise_and_change_nothing(steps, transition):
    books = Books()
    life = books.lifecycle()
    for step in steps:
        getattr(life, step)(*(("reset",) if step == "begin" else ()))
    state, operation, frees = life.state, life.operation, list(books.frees)
    with pytest.raises(LifecycleError, match="only allowed from|without a running"):
        getattr(life, transition)(*(("step",) if transition == "begin" else ()))
    assert (life.state, life.operation, books.frees) == (state, operation, frees)


def test_a_freed_lifecycle_lets_go_of_its_session():
    """The callbacks (which refer to the session) are dropped at the free, so
    the session and its segment's mapping are not kept by a reference cycle."""
    books = Books()
    life = books.lifecycle()
    life.open()
    life.close()
    assert books.frees == [True]
    with pytest.raises(LifecycleError):
        life._free(True)
