"""A VecEnv's info: the buffers its keys come from (the env's own info fields,
a hosted env's info slots and columns, the episode log), the keys envd writes
itself (episode statistics), and its assembly as gymnasium's vector envs
build it (InfoBuilder: the info of a reset, a step or a recv's batch, over
the env's buffers)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
from gymnasium.vector import VectorEnv

from envd import info_codec, leaves
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


#: The buffers of envd's episode statistics (info[key]["r"|"l"|"t"]).
EPISODE_STATS = ("episode_returns", "episode_lengths", "episode_times")
#: Gathered by a recv only for a batch in which an episode ended (only then in
#: its info; the leaves "final_observations.<k>" of a composite space too).
_ON_DONE = frozenset({*EPISODE_STATS, "final_observations", EPISODE_LOG})


def gathered_on_done(name: str) -> bool:
    """Whether a recv gathers buffer name only for a batch in which an
    episode ended (its statistics, final observations and episode log)."""
    return name in _ON_DONE or name.startswith("final_observations.")


class InfoBuilder:
    """The info dicts of a VecEnv's results, over its buffers (name -> array,
    as buffer_layout names them): a step's (episode statistics, final
    observations, the episode log, the env's own fields and a hosted env's
    infos), a reset's and a recv batch's.  Its arrays are views of the
    buffers (or of the batch's), valid until the next call overwrites them,
    or copies with copy=True.  inline_infos: a hosted env stepped in this
    process sets it to each env's last [info] or [info, final info], as its
    env returned them (nothing encoded)."""

    def __init__(self, buffers: dict[str, np.ndarray], observation_space: Any,
                 episode_statistics_key: str | None, episode_fields: tuple[str, ...],
                 copy: bool):
        self._space = observation_space
        self._key = episode_statistics_key
        self._fields = episode_fields
        self._copy = copy
        self.inline_infos: list[Any] | None = None
        self._buffers = buffers
        self._dones = buffers["dones"]
        self._info_lengths = buffers.get(INFO_LENGTHS)
        # the info columns: (key, buffer name), and with the type a value has
        self._info_columns = [(name[len(INFO_COLUMN_PREFIX):], name) for name in buffers
                              if name.startswith(INFO_COLUMN_PREFIX)]
        self._info_column_types = [(key, name, info_column_type(buffers[name]))
                                   for key, name in self._info_columns]
        self._info_column_masks = [(key, "_" + key, name) for key, name in self._info_columns]
        self._agent_mask = buffers.get("agent_mask")
        self._episode_log = buffers.get(EPISODE_LOG)  # (with episode_fields)
        # a step's info["envd_log"]: field -> its column of the log, a view
        # (a step writes every row of the log: 0 where no episode ended)
        self._log_columns = (dict(zip(episode_fields, self._episode_log.T))
                             if self._episode_log is not None and episode_fields else None)
        self._stats = tuple(buffers[name] for name in EPISODE_STATS)
        self._final_obs_names = leaves.leaf_names("final_observations", observation_space)
        self._final_obs = (self._tree(buffers, "final_observations")
                           if self._final_obs_names[0] in buffers else None)
        # done_info's fast form (copy=False, no final observations): the
        # info's dicts built once, copied per step (a step's info is the
        # caller's to change); None where _episode_info builds it
        self._done_template = (None if copy or self._final_obs is not None else
                               self._episode_info(self._dones, None, self._stats,
                                                  self._log_columns))
        self._done_nested = (() if self._done_template is None else
                             tuple(key for key, value in self._done_template.items()
                                   if isinstance(value, dict)))
        # the env's own info fields: info key -> buffer
        self._env_info = {name[len(INFO_PREFIX):]: array for name, array in buffers.items()
                          if name.startswith(INFO_PREFIX)}
        #: whether a step's info has more than the episode info (add_more_info)
        self.more_info = (bool(self._env_info) or self._agent_mask is not None
                          or self._info_lengths is not None)

    def _tree(self, arrays: dict[str, np.ndarray], prefix: str) -> Any:
        return leaves.unflatten(self._space, [arrays[name]
                                              for name in leaves.leaf_names(prefix, self._space)])

    def gathered_names(self) -> list[str]:
        """The buffers a recv gathers into its batch for the info, in order
        (after the observations, rewards and flags)."""
        names = [*EPISODE_STATS]
        if self._final_obs is not None:
            names += self._final_obs_names
        if self._info_lengths is not None:
            names += [INFO_SLOTS, INFO_LENGTHS]
            if self._info_columns:
                names += [INFO_IN_COLUMNS, *(name for _, name in self._info_columns)]
        names += [INFO_PREFIX + name for name in self._env_info]
        if self._agent_mask is not None:
            names.append("agent_mask")
        if self._episode_log is not None:
            names.append(EPISODE_LOG)
        return names

    def done_info(self) -> dict[str, Any]:
        """The info of a step in which some episode ended (see _episode_info).
        Like the other results, its arrays are views valid until the next step
        (copies with copy=True).  A step wrote every row of the episode log
        (0 where no episode ended: vec.h), so its columns are the log's own."""
        # (fixed cost of every step in which an episode ended: no array is
        # made unless copy=True; cheap Ocean envs end one nearly every step)
        template = self._done_template
        if template is not None:  # every value a view, each dict a fresh copy
            info = template.copy()
            for key in self._done_nested:
                info[key] = info[key].copy()
            return info
        if not self._copy:
            return self._episode_info(self._dones, self._final_obs, self._stats,
                                      self._log_columns)
        stats = self._stats
        if self._key is not None:
            stats = tuple(a.copy() for a in stats)
        columns = self._log_columns
        if columns is not None:
            columns = {name: column.copy() for name, column in columns.items()}
        return self._episode_info(self._dones.copy(), self._final_obs, stats, columns)

    def _env_info_now(self) -> dict[str, np.ndarray]:
        """The env's info fields after a reset or step (and a multi-agent
        env's "agent_mask"): views, or copies with copy=True."""
        info = dict(self._env_info)
        if self._agent_mask is not None:
            info["agent_mask"] = self._agent_mask
        if self._copy:
            return {name: array.copy() for name, array in info.items()}
        return info

    def reset_info(self, mask: np.ndarray | None) -> dict[str, Any]:
        """The info of a reset (mask: its reset_mask, or None)."""
        info = self._env_info_now() if self._env_info or self._agent_mask is not None else {}
        if self._info_lengths is not None:
            self._add_env_infos(info, self._buffers, mask)
        return info

    def add_more_info(self, info: dict[str, Any]) -> None:
        """Add a step's info beyond the episode info (when more_info): the
        env's own fields and agent mask, and a hosted env's infos."""
        if self._env_info or self._agent_mask is not None:
            info.update(self._env_info_now())
        if self._info_lengths is not None:
            self._add_env_infos(info, self._buffers)

    def _episode_info(self, dones: np.ndarray, final_rows: Any,
                      stats: tuple[np.ndarray, ...],
                      log_columns: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
        """gymnasium's RecordEpisodeStatistics shape, info[key]["r"|"l"|"t"]
        (stats) with the mask info["_" + key] (dones), key being
        episode_statistics_key ("envd_episode" by default), and for SAME_STEP
        info["final_obs"] (an object array of copies of final_rows) and
        info["final_info"].  An env with an episode log (log_columns: field ->
        float64 per row, 0 where no episode ended; not kept by info) also
        gets info["envd_log"] (those columns) and its mask info["_envd_log"]
        (gymnasium's _add_info shape), whatever episode_statistics says."""
        info: dict[str, Any] = {}
        if log_columns is not None:
            info[EPISODE_LOG_KEY] = dict(log_columns)  # (a fresh dict per step)
            info["_" + EPISODE_LOG_KEY] = dones.copy() if self._copy else dones
        if final_rows is not None:
            final = np.full(len(dones), None, dtype=object)
            for k in np.flatnonzero(dones).tolist():
                final[k] = leaves.row_of(self._space, final_rows, k)
            info["final_obs"], info["_final_obs"] = final, dones
            info["final_info"], info["_final_info"] = {}, dones
        key = self._key
        if key is not None:
            info[key] = {"r": stats[0], "l": stats[1], "t": stats[2]}
            info["_" + key] = dones
        return info

    def recv_info(self, out: dict[str, np.ndarray], any_done: Any) -> dict[str, Any]:
        """The info of a recv's batch: out, the batch's buffers (gathered_names
        among them, "env_id" the env of each row), any_done: whether an
        episode ended in it (only then were the statistics gathered)."""
        info: dict[str, Any] = {"env_id": out["env_id"]}
        if self._agent_mask is not None:
            info["agent_mask"] = out["agent_mask"]
        for name in self._env_info:
            info[name] = out[INFO_PREFIX + name]
        if any_done:
            final = self._tree(out, "final_observations") if self._final_obs is not None else None
            log = out.get(EPISODE_LOG)
            # (a copy: the gathered rows of envs reset since their last step
            # keep the log of that step)
            columns = (None if log is None or not self._fields else
                       dict(zip(self._fields, ended_columns(log, out["dones"]))))
            info.update(self._episode_info(out["dones"], final,
                                          tuple(out[name] for name in EPISODE_STATS), columns))
        if self._info_lengths is not None:
            self._add_env_infos(info, out, env_ids=out["env_id"])
        return info

    def _add_env_infos(self, info: dict[str, Any], out: dict[str, np.ndarray],
                       mask: np.ndarray | None = None, env_ids: np.ndarray | None = None
                       ) -> None:
        """Merge the envs' own infos into info, as gymnasium's vector envs
        merge them (VectorEnv._add_info: info[key] plus the mask
        info["_" + key], nested dicts alike); a SAME_STEP done env's step
        info goes under info["final_info"].  out: the result's buffers (row
        k is env k of a step, env env_ids[k] of a recv); a row's info is
        its columns' row (INFO_IN_COLUMNS), its msgpack slot (length not 0)
        or, stepped in this process, the env's own dict (inline_infos);
        mask: the rows that count (a masked reset).  Every array is as long
        as the result, as the other results are."""
        lengths = out[INFO_LENGTHS]
        in_columns = out.get(INFO_IN_COLUMNS)
        if mask is not None:
            lengths = lengths * mask
            if in_columns is not None:
                in_columns = in_columns & mask
        if in_columns is not None and in_columns.tobytes().count(0) == 0:
            # (the common case: every env's info is its columns' row; the
            # masks are rows of one array, one allocation for all)
            masks = np.ones((len(self._info_column_masks), len(in_columns)), np.bool_)
            for (key, mask_key, name), key_mask in zip(self._info_column_masks, masks):
                info[key] = out[name].copy()
                info[mask_key] = key_mask
            return
        # (no info at all, the other common case: zero bytes counted, a
        # fraction of a numpy reduction's cost on the step's critical path)
        if lengths.tobytes().count(0) == lengths.nbytes and (
                in_columns is None or in_columns.tobytes().count(0) == in_columns.nbytes):
            return
        # The envs whose info is not in the columns, merged env by env; then
        # the columns' envs at once, over them (_merge_columns).
        slotted = lengths != 0 if in_columns is None else (lengths != 0) & ~in_columns
        merger = InfoMerger(len(lengths))
        infos: dict[str, Any] = {}
        finals: dict[str, Any] = {}
        payloads: dict[int, dict] = {}
        inline = self.inline_infos
        for k in np.flatnonzero(slotted).tolist():
            if inline is not None:
                payload = inline[k if env_ids is None else int(env_ids[k])]
            else:
                payload = info_codec.decode(out[INFO_SLOTS][k, :int(lengths[k])].tobytes())
            payloads[k] = payload[0]
            infos = merger._add_info(infos, payload[0], k)
            if len(payload) > 1:
                finals = merger._add_info(finals, payload[1], k)
        if in_columns is not None and in_columns.any():
            self._merge_columns(infos, out, in_columns, payloads)
        if finals:  # (its mask "_final_info", the dones, is set with final_obs)
            info["final_info"] = finals
        info.update(infos)

    def _merge_columns(self, infos: dict[str, Any], out: dict[str, np.ndarray],
                       rows: np.ndarray, payloads: dict[int, dict]) -> None:
        """Add the rows (a bool mask) whose info is their columns' to infos,
        which holds the other envs' (payloads: row -> its info) merged: the
        same dict as _add_info of every env in row order.  A key's array
        takes the type of the first env that has it (gymnasium's rule): the
        column's when that env is a column row, else the other env's, the
        column values cast into it."""
        first = int(np.argmax(rows))
        others = ~rows
        for key, name, kind in self._info_column_types:
            column = out[name]
            mask = infos.get("_" + key)
            if mask is None or first < int(np.argmax(mask)):
                array = column.copy()
                array[others] = 0  # (zeros where rows is not set)
                if mask is not None:  # (the other envs' values, cast as _add_info casts them)
                    for k in np.flatnonzero(mask).tolist():
                        array[k] = payloads[k][key]
                    mask = mask | rows
                else:
                    mask = rows.copy()
            else:
                array = infos[key]
                if not isinstance(array, np.ndarray) or array.dtype == object:
                    # (the values themselves, as _add_info keeps them)
                    for k in np.flatnonzero(rows).tolist():
                        array[k] = kind(column[k])
                else:
                    array[rows] = column[rows]
                mask = mask | rows
            infos[key], infos["_" + key] = array, mask
