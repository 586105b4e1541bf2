"""The batch buffers of a vec: name -> (shape, dtype) of each, in a fixed
order (the shared memory's, envd.shm; the native vec's, envd.native)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from envd import leaves
from envd.vec_info import (
    EPISODE_LOG,
    INFO_COLUMN_PREFIX,
    INFO_IN_COLUMNS,
    INFO_LENGTHS,
    INFO_PREFIX,
    INFO_SLOTS,
)


def buffer_layout(observation_space: spaces.Space, action_space: spaces.Space, num_envs: int,
                  mode: AutoresetMode, info_fields: Sequence[Any] = (),
                  reward_dtype: Any = np.float32, info_bytes: int = 0, num_agents: int = 1,
                  episode_fields: Sequence[str] = (),
                  info_columns: Sequence[tuple[str, str, tuple[int, ...]]] = (),
                  agent_rows: bool = False) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """name -> (shape, dtype) of every batch buffer of a vec, in a fixed order.
    The native vec reads "actions", "reset_seeds" and "reset_mask" and writes
    the rest; "final_observations" exists in SAME_STEP mode only; info_fields
    (objects with name, shape and dtype, as EnvSpec.info_fields) add one
    buffer each.  Observations have one buffer per leaf of their space and
    actions one row per env (envd.leaves); hosted envs have float64 rewards
    (as gymnasium's vector envs) and, with info_bytes > 0, info slots of
    that many bytes per env, and info_columns ((key, dtype str, shape of
    a value)) a column each (INFO_COLUMN_PREFIX + key) and the flags INFO_IN_COLUMNS.
    A multi-agent env (num_agents > 1, or agent_rows: a PettingZoo env of
    one agent) has num_envs
    rows (envs x agents) and an "agent_mask" buffer; its reset seeds and mask
    use the first num_envs / num_agents entries (one per env).  An env with
    an episode log (ABI 5 episode_fields) has "episode_log": a row of its
    fields' values per row (info["envd_log"])."""
    n = num_envs
    action_shape, action_dtype = leaves.action_row(action_space)
    layout = {
        **leaves.observation_buffers("observations", observation_space, n),
        "actions": ((n, *action_shape), action_dtype),
        "rewards": ((n,), reward_dtype),
        "terminations": ((n,), np.bool_),
        "truncations": ((n,), np.bool_),
        "episode_returns": ((n,), np.float64),
        "episode_lengths": ((n,), np.int64),
        "episode_times": ((n,), np.float64),
        "dones": ((n,), np.bool_),
        "reset_seeds": ((n,), np.uint64),
        "reset_mask": ((n,), np.bool_),
    }
    if mode is AutoresetMode.SAME_STEP:
        layout.update(leaves.observation_buffers("final_observations", observation_space, n))
    for field in info_fields:
        layout[INFO_PREFIX + field.name] = ((n, *field.shape), field.dtype)
    if num_agents > 1 or agent_rows:
        layout["agent_mask"] = ((n,), np.bool_)
    if episode_fields:
        layout[EPISODE_LOG] = ((n, len(episode_fields)), np.float64)
    if info_bytes:
        layout[INFO_SLOTS] = ((n, info_bytes), np.uint8)
        layout[INFO_LENGTHS] = ((n,), np.uint32)
        if info_columns:
            layout[INFO_IN_COLUMNS] = ((n,), np.bool_)
            for key, dtype, shape in info_columns:
                layout[INFO_COLUMN_PREFIX + key] = ((n, *shape), dtype)
    return {name: (shape, np.dtype(dtype)) for name, (shape, dtype) in layout.items()}
