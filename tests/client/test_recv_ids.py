"""The client refuses a daemon's recv answer that names envs out of range:
BatchedVecEnv's gather indexes the buffers with a recv's ids unchecked
(numpy's unbuffered take, mode "clip"), so a bad id must not reach it."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from gymnasium import spaces

from envd.client.multi_async import IDLE, IN_FLIGHT, READY, ShardsStepper
from envd.client.transports.over_socket import SocketStepper
from envd.errors import ProtocolError
from envd.vec_rows import RepeatCheck, run_of


class RepliesWith:
    """A channel whose every posted request gets one canned reply, read by
    the wait for it."""

    endpoint = "ipc:///nowhere"
    timeout = 1.0

    def __init__(self, reply: dict[str, Any]):
        self.reply = reply

    def post(self, header: dict[str, Any], blobs: Any, on_reply: Any) -> int:
        return 1

    def wait_posted(self, request_id: int, kind: str, deadline: float | None = None) -> dict:
        return self.reply

    def read_late_replies(self) -> None:
        pass


def stepper_answering(ids: list[int]) -> SocketStepper:
    reply = {"ok": True, "_blobs": [np.array(ids, np.int64).tobytes()]}
    return SocketStepper(RepliesWith(reply), "session", "CartPole-v1", spaces.Discrete(2), 4,
                         {"actions": np.zeros(4, np.int64)})


@pytest.mark.parametrize("ids", [[0, 4], [-1, 2], [7, 1]])
def test_a_recv_answer_naming_envs_out_of_range_is_refused(ids):
    with pytest.raises(ProtocolError, match=r"outside \[0, 4\)"):
        stepper_answering(ids).recv(2)


@pytest.mark.parametrize("ids", [[1, 1], [3, 0, 3]])
def test_a_recv_answer_naming_an_env_twice_is_refused(ids):
    """(A send of the batch straight back skips the id checks: the
    answer's ids must be each once.)"""
    with pytest.raises(ProtocolError, match="names an env twice"):
        stepper_answering(ids).recv(len(ids))


def test_a_recv_answer_in_range_is_returned():
    assert stepper_answering([3, 0]).recv(2).tolist() == [3, 0]


class OneShard:
    """What ShardsStepper._check_answered_ids reads of a daemon's part:
    envs 4..7 of the MultiVecEnv, three of them in flight there."""

    rows = slice(4, 8)
    in_flight = 3
    where = "the daemon at ipc:///nowhere, serving envs 4..7"


class Books:
    """What it reads of the stepper: 0, 1, 2, ... as long as the
    MultiVecEnv's rows (8), its repeat check and its envs' states (all in
    flight but those in not_in_flight)."""

    _positions = np.arange(8, dtype=np.int64)
    _repeat_check = RepeatCheck(8)
    _all_in_flight = bytes([IN_FLIGHT]) * 8

    def __init__(self, not_in_flight: dict[int, int]):
        self._state = np.full(8, IN_FLIGHT, np.int8)
        for env, state in not_in_flight.items():
            self._state[env] = state


def check_answer(ids: list[int], not_in_flight: dict[int, int] | None = None) -> slice | None:
    return ShardsStepper._check_answered_ids(Books(not_in_flight or {}), OneShard(),
                                                  np.array(ids, np.int64))


@pytest.mark.parametrize("ids", [[], [0, 1, 2, 3], [-1], [4], [0, 9], [2, 3, 4], [4, 5, 6]])
def test_a_daemons_recv_answer_over_several_daemons_is_checked(ids):
    """Over several daemons (socket and doorbell answers alike), a recv answer
    naming no env, more envs than are in flight there, or a local id outside
    the daemon's envs (a sorted run past them too) is refused before its
    rows are copied or the books indexed with it."""
    with pytest.raises(ProtocolError, match="answered a recv with"):
        check_answer(ids)


@pytest.mark.parametrize("ids", [[0, 0, 2], [2, 0, 2], [1, 1]])
def test_a_daemons_recv_answer_naming_an_env_twice_is_refused(ids):
    """[0, 0, 2] would span 0..2 and pass for the run of envs 4..6, marking
    env 5 ready though the daemon never answered for it."""
    with pytest.raises(ProtocolError, match="naming an env twice"):
        check_answer(ids)


@pytest.mark.parametrize("ids", [[0, 1, 2], [2, 1], [1]])
@pytest.mark.parametrize("state", [IDLE, READY])
def test_a_daemons_recv_answer_naming_an_env_not_in_flight_is_refused(ids, state):
    """Env 5 (local 1) idle, or ready (answered before: a second answer
    naming it would have it received twice, and a send of that batch
    straight back skips the id checks): refused, run or not."""
    with pytest.raises(ProtocolError, match="naming an env not in flight"):
        check_answer(ids, {5: state})
    assert check_answer([0, 2], {5: state}) is None  # (the others are in flight)


def test_a_daemons_recv_answer_within_its_envs_is_taken():
    """Taken, with the slice of global ids the envs fill when they are
    consecutive (in any order: the books then mark them by slice)."""
    assert check_answer([3, 0, 2]) is None
    assert check_answer([2, 0, 1]) == slice(4, 7)
    assert check_answer([1, 2, 3]) == slice(5, 8)
    assert check_answer([3]) == slice(7, 8)


def test_a_batch_is_gathered_as_a_slice_only_when_its_rows_are_a_run_in_range():
    """run_of: the rows a recv copies as one slice per buffer (a run of
    consecutive, increasing rows within the buffers), else None (a take)."""
    positions = np.arange(8, dtype=np.int64)
    assert run_of(np.array([2, 3, 4], np.int64), positions) == slice(2, 5)
    assert run_of(np.array([7], np.int64), positions) == slice(7, 8)
    for rows in ([3, 2, 4], [2, 4, 5], [6, 7, 8], [-1, 0, 1], [2, 2, 3], []):
        assert run_of(np.array(rows, np.int64), positions) is None, rows
    assert run_of(np.array([2, 3], np.int32), positions) is None  # (compared as int64 bytes)
