"""The client refuses a daemon's recv answer that names envs out of range:
BatchedVecEnv's gather indexes the buffers with a recv's ids unchecked
(numpy's unbuffered take, mode "clip"), so a bad id must not reach it."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from gymnasium import spaces

from envd.client.transports.over_socket import SocketStepper
from envd.errors import ProtocolError


class RepliesWith:
    """A channel whose every request gets one canned reply."""

    endpoint = "ipc:///nowhere"
    timeout = 1.0

    def __init__(self, reply: dict[str, Any]):
        self.reply = reply

    def request(self, header: dict[str, Any], blobs: Any = (), late: Any = None) -> dict:
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


def test_a_recv_answer_in_range_is_returned():
    assert stepper_answering([3, 0]).recv(2).tolist() == [3, 0]
