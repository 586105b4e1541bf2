"""The range checks of a send's actions for a VecEnv whose envs a daemon
steps (SendRowChecks)."""
from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from envd import leaves
from envd.errors import InvalidActionError
from envd.vec_errors import action_out_of_range


class SendRowChecks:
    """Range checks of a send's actions for a VecEnv whose envs a daemon
    steps (RemoteVecEnv, MultiVecEnv): over the socket the daemon would
    refuse an out-of-range action only after send has returned (sends are
    posted), so they are checked here, with the in-process message, whatever
    the transport.  The subclass calls _init_send_row_checks() once its
    single_action_space is set; its num_agents names rows in the errors."""

    # (the VecEnv's own attributes, which the mixin reads)
    env_id: str
    single_action_space: spaces.Space[Any]
    num_agents: int

    def _init_send_row_checks(self) -> None:
        space = self.single_action_space
        #: (start, stop) of a Discrete action space, else None
        self._discrete = ((space.start, space.start + space.n)
                          if isinstance(space, spaces.Discrete) else None)
        #: a MultiDiscrete, MultiBinary or Dict/Tuple space with integer leaves
        self._range_checked = self._discrete is None and bool(leaves.range_checks(space))

    def _check_send_rows(self, rows: np.ndarray, env_ids: np.ndarray) -> None:
        if self._discrete is not None and len(rows):
            start, stop = self._discrete
            if rows.min() < start or rows.max() >= stop:
                k = int(np.flatnonzero((rows < start) | (rows >= stop))[0])
                space = self.single_action_space
                assert isinstance(space, spaces.Discrete)  # (self._discrete: a Discrete's only)
                raise action_out_of_range(self.env_id, space,
                                          int(rows[k]), self._row_id(env_ids, k))
        elif self._range_checked and len(rows):
            k = leaves.first_row_out_of_range(self.single_action_space, rows)
            if k >= 0:
                raise InvalidActionError(leaves.action_range_message(
                    self.env_id, self.single_action_space, rows[k], self._row_id(env_ids, k)))

    def _row_id(self, env_ids: np.ndarray, k: int) -> int:
        """The row (as the in-process vec names it: env * num_agents + agent)
        of row k of a send to env_ids (one id per env)."""
        return int(env_ids[k // self.num_agents]) * self.num_agents + k % self.num_agents
