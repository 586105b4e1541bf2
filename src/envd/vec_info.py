"""A VecEnv's info: the buffers its keys come from (the env's own info fields,
a hosted env's info slots and columns, the episode log), the keys envd writes
itself (episode statistics), and the helpers that build its values as
gymnasium's vector envs do."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
from gymnasium.vector import VectorEnv

from envd.errors import InvalidArgumentError

#: Buffers named INFO_PREFIX + name hold the env's own info fields (e.g.
#: "info.action_mask"); they appear in every reset/step/recv info under name.
INFO_PREFIX = "info."
#: envd's own info keys (env_id, episode, final_obs, final_info, and "_" masks)
#: are refused as field names by the C validation (errors.c).

#: Where envd reports finished episodes by default (make's
#: episode_statistics=True): a key of its own, so that gymnasium's
#: RecordEpisodeStatistics wrapper, which refuses an info that already has
#: its key "episode", works on a default env.  episode_statistics="episode"
#: puts them under gymnasium's key instead (code written for that shape).
DEFAULT_EPISODE_KEY = "envd_episode"
#: Info keys envd writes itself: an episode statistics key cannot be one.
RESERVED_INFO_KEYS = frozenset({"env_id", "final_obs", "final_info", "envd_log"})


def episode_statistics_key(value: bool | str) -> str | None:
    """The info key of make's episode_statistics: True -> "envd_episode",
    False -> None (no statistics), a str -> that key (e.g. "episode")."""
    if value is True or value is False or isinstance(value, np.bool_):
        return DEFAULT_EPISODE_KEY if value else None
    if (isinstance(value, str) and value.isidentifier() and not value.startswith("_")
            and value not in RESERVED_INFO_KEYS):
        return value
    raise InvalidArgumentError(
        f"episode_statistics must be True (info[{DEFAULT_EPISODE_KEY!r}]), False (none) or an "
        f"info key such as 'episode' (an identifier not starting with '_', not one of "
        f"{sorted(RESERVED_INFO_KEYS)}), got {value!r}")


#: A hosted env's info slots (docs/python-envs.md, "Infos"): env i's info,
#: msgpack-encoded (envd.info_codec), lies in infos[i, :info_lengths[i]]
#: (length 0: the env gave no info in its last reset or step).
INFO_SLOTS, INFO_LENGTHS = "infos", "info_lengths"
#: A hosted env's info columns (docs/python-envs.md, "Infos"): a scalar info
#: key that kept one type while the env was described gets a buffer
#: INFO_COLUMN_PREFIX + key of that type, and env i's info of a step is those
#: columns' row i, without its slot, when info_in_columns[i] is set.
INFO_COLUMN_PREFIX, INFO_IN_COLUMNS = "info_column.", "info_in_columns"


def info_column_type(column: np.ndarray) -> Callable[[Any], Any]:
    """What makes a column's row the value an env gave, as gymnasium's
    _add_info batches it (np.zeros(num_envs, dtype=type(value)), or the
    array's dtype and shape): a copy of an array's row, numpy's scalar type
    of the dtype, but Python's bool for a bool column (a numpy bool would
    make an object array)."""
    if column.ndim > 1:
        return np.copy
    return bool if column.dtype == np.bool_ else column.dtype.type


#: The buffer of an env's own episode log (ABI 5 episode_fields), and the
#: info key it is reported under (field -> float64 per row, mask "_envd_log").
EPISODE_LOG, EPISODE_LOG_KEY = "episode_log", "envd_log"


class InfoMerger:
    """gymnasium's VectorEnv._add_info (its arrays and masks, nested dicts
    alike) for results of `rows` rows: gymnasium sizes them by num_envs,
    which an async recv's batch is not."""

    def __init__(self, rows: int):
        self.num_envs = rows

    # (gymnasium's method, borrowed: it reads only self.num_envs, which its
    # self type, a VectorEnv, does not say)
    _add_info: ClassVar[Callable[[Any, dict[str, Any], dict[str, Any], int], dict[str, Any]]] = (
        VectorEnv._add_info)


#: np.where costs about 7 ns a row of the log (27 us a step for 4096 rows of
#: 4 fields), a copy of the ended rows by index about 30 ns an ended row plus
#: the search for them: ended_columns takes the index on long logs where few
#: rows ended (measured for issue 36).
_WHERE_MAX_ROWS = 256
_INDEX_MAX_SHARE = 8  # at most 1 row in 8 ended


def ended_columns(log: np.ndarray, dones: np.ndarray) -> np.ndarray:
    """np.where(dones[:, None], log, 0.0).T: the columns of log (one per
    field, views of a new array) with the rows where dones is False zeroed,
    made the cheaper way for the log's size."""
    if len(dones) > _WHERE_MAX_ROWS:
        ended = np.flatnonzero(dones)
        if len(ended) * _INDEX_MAX_SHARE <= len(dones):
            values = np.zeros(log.shape, log.dtype)
            values[ended] = log[ended]
            return values.T
    return np.where(dones[:, None], log, 0.0).T
