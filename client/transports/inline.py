"""The inline transport: for a process that cannot map the session's
segment (another host, IPC namespace or user).

The buffers are private memory with the segment's layout; requests carry the
inputs (actions, reset seeds and mask) and replies the outputs as extra
frames (envd.protocol, "Inline transport").  The same bytes land in the same
buffers as over shared memory, so everything above (BatchedVecEnv) is shared
and results are bit-identical.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from envd import protocol
from envd.client.transports.over_socket import SocketStepper
from envd.errors import ProtocolError

#: the outputs a reset gives every row of its envs (env_slot.c envd_slot_reset_rows)
_FRESH_ROWS = (("rewards", 0), ("terminations", False), ("truncations", False),
               ("dones", False), ("agent_mask", True))


def _frame(array: np.ndarray) -> memoryview:
    """An array as one data frame (its bytes, C order, not copied)."""
    return np.ascontiguousarray(array).data.cast("B")


class InlineStepper(SocketStepper):
    """SocketStepper whose messages carry the arrays."""

    transport = "inline"
    outputs_in_replies = True

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        actions = self.buffers["actions"]
        self._step_header.update(
            inline=True, actions={"dtype": actions.dtype.str, "shape": list(actions.shape)})
        self._outputs = protocol.output_arrays(self.buffers)

    def async_reset(self, with_seeds: bool) -> None:
        """(Its reply carries no outputs: the recvs carry each env's rows.)
        Every env's rows here become a fresh episode's as the daemon's reset
        wrote them in its segment (env_slot.c envd_slot_reset_rows): reward
        0, the flags False, every agent alive; the observations stay as
        they were until a recv brings them."""
        super().async_reset(with_seeds)
        for name, fresh in _FRESH_ROWS:
            if name in self.buffers:
                self.buffers[name][...] = fresh

    def _request_reset(self, with_seeds: bool, with_mask: bool) -> tuple[dict, Sequence]:
        header, _ = super()._request_reset(with_seeds, with_mask)
        inputs = [_frame(self.buffers[name]) for name, given in
                  (("reset_seeds", with_seeds), ("reset_mask", with_mask)) if given]
        return {**header, "inline": True}, inputs

    def _request_step(self) -> tuple[dict, Sequence]:
        return dict(self._step_header), [_frame(self.buffers["actions"])]

    def _request_send(self, env_ids: np.ndarray) -> tuple[dict, Sequence]:
        header, blobs = super()._request_send(env_ids)
        return {**header, "inline": True}, [*blobs, _frame(self.buffers["actions"][self.rows_of(env_ids)])]

    def _request_recv(self, count: int) -> tuple[dict, Sequence]:
        header, blobs = super()._request_recv(count)
        return {**header, "inline": True}, blobs

    def _take_outputs(self, reply: dict[str, Any], blobs: list, rows: np.ndarray | None) -> None:
        """Copy the reply's output arrays into the buffers: whole, or the
        given envs' rows (a recv's envs, in the order of the blobs' rows)."""
        if reply.get("arrays") != self._outputs or len(blobs) != len(self._outputs):
            raise ProtocolError(
                f"the daemon's inline reply carries arrays {reply.get('arrays')!r} in "
                f"{len(blobs)} frame(s); expected {self._outputs}")
        if rows is not None:
            rows = self.rows_of(rows)
        for name, blob in zip(self._outputs, blobs):
            target = self.buffers[name]
            count = len(target) if rows is None else len(rows)
            if len(blob) != count * target[0].nbytes:
                raise ProtocolError(f"the daemon's inline {name!r} frame holds {len(blob)} "
                                    f"bytes, expected {count * target[0].nbytes}")
            values = np.frombuffer(blob, target.dtype).reshape(count, *target.shape[1:])
            if rows is None:
                target[...] = values
            else:
                target[rows] = values
