"""What the in-process and the daemon-served VecEnv share: the gymnasium API.

Both are N envs stepped over one set of batch buffers (numpy arrays in the
process, or views of a session's shared memory); they differ only in who runs
a reset or a step: the native core in this process, or the daemon.  Keeping
argument checks, action conversion, the info dict and the view/copy rules
here makes the two behave the same by construction.  What it shares with the
client and the daemon beyond this class lies in modules of one idea each:
the buffers (envd.buffer_layout), the info (envd.vec_info), a batch's rows
(envd.vec_rows), the errors (envd.vec_errors), a send's range checks
(envd.send_row_checks), autoreset modes (envd.autoreset) and integer
arguments (envd.int_args).

Lifetime of returned arrays: the observation, reward, termination and
truncation arrays returned by ``reset``/``step`` (and the arrays in ``info``)
are views that stay valid until the next call that steps or resets this env,
which overwrites them in place.  Keep a copy (or pass ``copy=True`` to
``make``) to hold on to them.
"""
from __future__ import annotations

import dis
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from envd import info_codec, leaves
from envd.errors import EnvStateError, InvalidActionError, InvalidArgumentError, NativeError
from envd.int_args import seed_list
from envd.stepping import NO_STEPPER, Stepper
from envd.vec_info import (
    EPISODE_LOG,
    EPISODE_LOG_KEY,
    INFO_COLUMN_PREFIX,
    INFO_IN_COLUMNS,
    INFO_LENGTHS,
    INFO_PREFIX,
    INFO_SLOTS,
    InfoMerger,
    ended_columns,
    episode_statistics_key,
    info_column_type,
)
from envd.vec_rows import GatherPlan, LastBatch, RepeatCheck, run_of


def possible_agents(names: Sequence[str], num_agents: int) -> list[str]:
    """names when there is one per agent, else PettingZoo's (and mpe2's)
    default names agent_0, agent_1, ..."""
    if len(names) == num_agents:
        return list(names)
    return [f"agent_{i}" for i in range(num_agents)]


#: how often close() looks whether another thread's call gave the env back
_CLOSE_POLL_S = 0.001
#: how long close() waits for a call in progress before it leaks the env's
#: native session instead of freeing it (never free what a call may still be
#: in).  A call gives the env back when it ends; a daemon-served call ends at
#: its client's timeout at the latest (30 s by default), so twice that lets
#: every call with the default timeout end, while a token lost to an
#: interrupt under a tracer (the claim's note) costs close() a minute, not
#: forever.
_CLOSE_WAIT_S = 60.0
#: CPython 3.11 on raises a signal handler's exception (KeyboardInterrupt)
#: only at a function's start, a backward jump or right after a call
#: returns: one raised inside ``try: claim.pop()`` came after the pop took
#: the token (BatchedVecEnv's claim).  3.10 may raise it before any opcode,
#: the pop's included: there the token is not given back (a second one
#: would let two calls in at once).
_INTERRUPTED_AFTER_POP = sys.implementation.name == "cpython" and sys.version_info >= (3, 11)
#: the opcodes of the pop's call (3.11: PRECALL, CALL; 3.12 on: CALL), at
#: which alone CPython 3.11 on raises a signal's exception in the claim's
#: ``try`` (after the call returned): an exception raised at another
#: instruction came from a tracer (pdb, IDE debuggers, coverage: its line
#: event runs before the pop), and the token is not given back.  Empty where
#: the interrupt may come before any opcode (3.10, other implementations).
_POP_CALLED = (frozenset(dis.opmap[name] for name in ("PRECALL", "CALL") if name in dis.opmap)
               if _INTERRUPTED_AFTER_POP else frozenset())
#: the envs whose close() gave up waiting for a call: kept alive, with their
#: native sessions, so that nothing frees memory the call may still be in
_LEAKED: list[Any] = []


def _refuse_closed(env_id: str) -> int:
    """The step function of a closed env (BatchedVecEnv._step_fn)."""
    raise EnvStateError(f"this {env_id} VecEnv is closed")


class _RefuseClosing:
    """The step function of an env that close() is closing: it refuses
    whatever argument it is called with (a call may read the new function
    with the argument of before), so that a thread stepping in a loop gives
    the env back to close() at its next call."""

    def __init__(self, env_id: str):
        self.env_id = env_id

    def __call__(self, _arg: Any) -> int:
        return _refuse_closed(self.env_id)


def _unexpected_step_result(code: int) -> None:
    """The step error of a stepper without a bare step, which raises its
    errors instead of returning a negative code."""
    raise NativeError(f"a step returned {code}", code)


class BatchedVecEnv(VectorEnv):
    """A gymnasium VectorEnv over batch buffers, stepped through a Stepper.

    Subclasses bind the buffers (``_bind_buffers``, arrays as in
    buffer_layout), give their stepper to ``_use_stepper`` (envd.stepping.Stepper:
    it runs the envs and keeps the async books) and implement ``_render_frames()`` and
    ``_release()`` (free everything; idempotent).  This class keeps no async
    books: it checks what needs no state, writes the inputs, calls the
    stepper and gathers the outputs and infos.
    """

    def __init__(self, env_id: str, observation_space: spaces.Space, action_space: spaces.Space,
                 num_envs: int, mode: AutoresetMode, max_episode_steps: int | None,
                 copy: bool, episode_statistics: bool | str, batch_size: int | None = None,
                 render_mode: str | None = None, render_fps: int | None = None):
        self.closed = False
        #: close() has begun (then closed): every call from now on refuses
        self._closing = False
        #: the info key of envd's episode statistics, None when they are off
        #: (see episode_statistics_key); checked first so a bad value fails early
        self.episode_statistics_key = episode_statistics_key(episode_statistics)
        # One call at a time; a second Python thread gets a clear error instead
        # of corrupting a step in flight.  The claim is a list holding one
        # token: a call takes it (pop: IndexError while another call holds
        # it) and gives it back (append).  Each is one C call that keeps the
        # GIL (atomic; a free-threaded build locks the list), and the pair
        # costs a step about a third of threading.Lock's acquire(False) and
        # release (docs/benchmarks.md, "The Python layer of a step").  Ctrl-C
        # must not lose the token: an exception other than IndexError inside
        # ``try: claim.pop()`` is an interrupt, and its handler gives the
        # token back when it surely came after the pop: the token is gone
        # (one still there proves the pop did not run) and it was raised at
        # the pop's call (_POP_CALLED; a tracer's line event raises before).
        # The handler makes no call before the append: each call's return
        # may raise a second interrupt.  Past that block each path reaches a
        # ``finally`` (or gives it back itself) before any other call.  Under
        # a tracer a token may still be lost (say, an interrupt as _acquire()
        # returns): close() waits for it at most _CLOSE_WAIT_S, then leaks the
        # native session (never frees it).  A token is doubled only where a
        # tracer's opcode event or a profiler's or sys.monitoring's call event
        # is interrupted at the pop's call while another thread's call holds
        # the env (a use refused anyway).
        # (Handlers cost nothing until run: the step's path is unchanged.)
        self._claim = [True]
        self.env_id = env_id
        self.num_envs = num_envs
        #: agents per env: each env is num_agents rows (a subclass sets it
        #: before binding buffers); num_envs counts rows
        self.num_agents = 1
        #: the names of the env's own episode log (ABI 5), info["envd_log"]'s
        #: keys; a subclass sets them before binding buffers
        self.episode_fields: tuple[str, ...] = ()
        #: the agents' names where the env gives them (a PettingZoo env's), else ()
        self.agent_names: tuple[str, ...] = ()
        # render_modes: what the env can render, rendering or not (gymnasium's
        # meaning); an env that renders has a frame rate (render_fps)
        self.metadata = {"autoreset_mode": mode,
                         "render_modes": ["rgb_array"] if render_fps is not None else []}
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            self.metadata["render_modes"].append(render_mode)
        if render_fps is not None:
            self.metadata["render_fps"] = render_fps
        #: None or "rgb_array" (checked by the subclass against the env's spec)
        self.render_mode = render_mode
        self.single_observation_space = observation_space
        self.single_action_space = action_space
        self.observation_space = batch_space(observation_space, num_envs)
        self.action_space = batch_space(action_space, num_envs)
        self.max_episode_steps = max_episode_steps or None
        self._copy = bool(copy)
        self._episode_statistics = self.episode_statistics_key is not None
        self.batch_size = num_envs if batch_size is None else batch_size
        self._stepper: Stepper = NO_STEPPER  # set by the subclass; NO_STEPPER again once closed
        # The step paths' step: _step_fn(_step_arg) (see _use_stepper); once
        # closed, the closed error: step_in_place tests no flag for it.  (No
        # bound method of self: a cycle would keep a dropped env's envs alive
        # until the garbage collector runs.)
        self._step_fn: Callable[[Any], int] = type(NO_STEPPER).step
        self._step_arg: Any = NO_STEPPER
        self._step_failed: Callable[[int], object] = _unexpected_step_result
        self._repeat_check = RepeatCheck(num_envs)  # (_checked_ids)
        self._positions = self._repeat_check.positions  # 0, 1, 2, ... (run_of)
        #: the last recv's batch, for the send of those envs (see LastBatch)
        self._last_batch: LastBatch | None = None
        self._recv_count = 0
        self._maybe_running = False  # a call timed out: the buffers may be in use
        self._owned: list[Any] = []  # closed after this env (close_along)
        #: a hosted env stepped in this process: each env's last [info] or
        #: [info, final info], as its env returned them (nothing encoded)
        self._inline_infos: list[Any] | None = None
        #: episodes ended in the last step (step_info's), None since a reset
        #: or async call
        self._last_num_done: int | None = None

    def _bind_buffers(self, buffers: dict[str, np.ndarray]) -> None:
        self._buffers = buffers
        self._plans: list[GatherPlan] | None = None  # recv's, over these buffers (built lazily)
        space = self.single_observation_space
        self._obs_names = leaves.leaf_names("observations", space)
        self._final_obs_names = leaves.leaf_names("final_observations", space)
        self._obs = self._tree(buffers, "observations")
        self._actions = buffers["actions"]
        # a Dict/Tuple action space: its leaves, views of the packed rows
        self._action_leaves = (leaves.leaf_views(self.single_action_space, self._actions)
                               if leaves.is_composite(self.single_action_space) else None)
        self._info_slots = buffers.get(INFO_SLOTS)
        self._info_lengths = buffers.get(INFO_LENGTHS)
        # the info columns: (key, buffer name), and with the type a value has
        self._info_columns = [(name[len(INFO_COLUMN_PREFIX):], name) for name in buffers
                              if name.startswith(INFO_COLUMN_PREFIX)]
        self._info_column_types = [(key, name, info_column_type(buffers[name]))
                                   for key, name in self._info_columns]
        self._info_column_masks = [(key, "_" + key, name) for key, name in self._info_columns]
        self._rewards = buffers["rewards"]
        self._terminations = buffers["terminations"]
        self._truncations = buffers["truncations"]
        self._dones = buffers["dones"]
        self._agent_mask = buffers.get("agent_mask")
        self._episode_log = buffers.get(EPISODE_LOG)  # (with episode_fields)
        # a step's info["envd_log"]: field -> its column of the log, a view
        # (a step writes every row of the log: 0 where no episode ended)
        self._log_columns = (dict(zip(self.episode_fields, self._episode_log.T))
                             if self._episode_log is not None and self.episode_fields else None)
        self._stats = tuple(buffers[name] for name in self._EPISODE_STATS)
        self._final_obs = (self._tree(buffers, "final_observations")
                           if self._final_obs_names[0] in buffers else None)
        # _done_info's fast form (copy=False, no final observations): the
        # info's dicts built once, copied per step (a step's info is the
        # caller's to change); None where _episode_info builds it
        self._done_template = (None if self._copy or self._final_obs is not None else
                               self._episode_info(self._dones, None, self._stats,
                                                  self._log_columns))
        self._done_nested = (() if self._done_template is None else
                             tuple(key for key, value in self._done_template.items()
                                   if isinstance(value, dict)))
        # the env's own info fields: info key -> buffer
        self._check_episode_statistics_key(buffers)
        self._env_info = {name[len(INFO_PREFIX):]: array for name, array in buffers.items()
                          if name.startswith(INFO_PREFIX)}
        # the fast path of step() compares against these (a builtin dtype is
        # one object: the identity test spares the slower == per step)
        self._action_dtype, self._action_shape = self._actions.dtype, self._actions.shape
        # whether a step's info has more than the episode info (one test a step)
        self._more_info = (bool(self._env_info) or self._agent_mask is not None
                           or self._info_lengths is not None)

    def _use_stepper(self, stepper: Stepper,
                     bare_step: tuple[Callable[[Any], int], Any] | None = None,
                     step_failed: Callable[[int], object] | None = None) -> None:
        """Step through stepper from now on.  bare_step: its step as a
        function and its one argument, which returns a negative code instead
        of raising (the in-process session's _envd_call.call and its Bound step:
        NativeSession.bare_step), whose error step_failed(code) raises; the
        step paths then call it directly, else stepper.step."""
        self._stepper = stepper
        if bare_step is None:
            bare_step = (type(stepper).step, stepper)
        self._step_fn, self._step_arg = bare_step
        if step_failed is not None:
            self._step_failed = step_failed

    def _check_episode_statistics_key(self, buffer_names: Any) -> None:
        """Refuse an episode_statistics key that is one of the env's own info
        fields (buffer_names: the names of its buffers, before or after they
        are mapped)."""
        key = self.episode_statistics_key
        if isinstance(key, str) and INFO_PREFIX + key in buffer_names:
            raise InvalidArgumentError(
                f"{self.env_id} has an info field {key!r}: pick another episode_statistics key")

    def _tree(self, arrays: dict[str, np.ndarray], prefix: str) -> Any:
        """The observation (prefix "observations" or "final_observations") as
        gymnasium batches its space, from arrays holding its leaves."""
        space = self.single_observation_space
        return leaves.unflatten(space, [arrays[name]
                                        for name in leaves.leaf_names(prefix, space)])

    # ---- subclass hooks ----------------------------------------------------------------
    def _release(self) -> None:
        raise NotImplementedError

    def _render_frames(self) -> np.ndarray | list[Any]:
        """A new (num_env_instances, height, width, 3) uint8 array of every env's frame
        (called with the env acquired, only when render_mode is "rgb_array";
        through the stepper's render, which refuses while envs are out); a
        hosted env's: the list of each env's own render()."""
        raise NotImplementedError

    def _check_send_rows(self, rows: np.ndarray, env_ids: np.ndarray) -> None:
        """Refuse a send's actions before they are written (the in-process vec
        validates them itself, at submit)."""

    def _check_buffers_free(self) -> None:
        """Raise before a call writes its inputs if the buffers may still be in
        use; called only while _maybe_running (a daemon-served env whose last
        call timed out) so the step path pays one attribute test."""

    # ---- helpers -----------------------------------------------------------------------
    def _convert_actions(self, actions: Any, buf: np.ndarray | None = None,
                         what: str | None = None, env_ids: np.ndarray | None = None) -> None:
        """Check actions against the action space and copy them into buf (the
        actions buffer, or rows of it).  Same-kind casts only: integers for
        discrete actions, floats that numpy casts safely for boxes; Python
        floats/lists are accepted.  A Dict/Tuple space takes a dict/tuple of
        batched leaves (as gymnasium's batch_space), each converted alike.
        env_ids: the env of each row of buf (a send's), for the errors."""
        buf = self._actions if buf is None else buf
        space = self.single_action_space
        what = what or f"num_envs={self.num_envs}"
        if self._action_leaves is None:
            self._convert_leaf(actions, buf, space, what, "", env_ids)
            return
        values = leaves.flatten(space, actions, f"{self.env_id}: actions")
        for value, view, (path, leaf) in zip(values, leaves.leaf_views(space, buf),
                                             leaves.leaves(space)):
            self._convert_leaf(value, view, leaf, what, leaves.path_name(path), env_ids)

    def _convert_leaf(self, actions: Any, buf: np.ndarray, space: spaces.Space, what: str,
                      where: str, env_ids: np.ndarray | None = None) -> None:
        from_python = not isinstance(actions, np.ndarray)
        array = np.asarray(actions)
        if array.shape != buf.shape:
            raise InvalidActionError(
                f"{self.env_id}: actions{where} must have shape {buf.shape} "
                f"({what} x action shape {buf.shape[1:]}), got {array.shape}")
        if buf.dtype.kind in "iu":
            allowed = array.dtype.kind in "biu"
            if allowed and array.size and not np.can_cast(array.dtype, buf.dtype, "safe"):
                # The cast below wraps what does not fit the leaf's dtype into
                # (maybe valid) values: 256 into an int8 MultiBinary is 0.
                self._check_fits(array, buf.dtype, space, where, env_ids)
        else:
            allowed = np.can_cast(array.dtype, buf.dtype, "safe") or (
                from_python and array.dtype.kind in "fiu")
        if not allowed:
            raise InvalidActionError(
                f"{self.env_id}: actions{where} must have dtype {buf.dtype} "
                f"(or one that casts to it without loss), got {array.dtype}; "
                f"convert with actions.astype(np.{buf.dtype})")
        np.copyto(buf, array, casting="unsafe")

    def _check_fits(self, array: np.ndarray, dtype: np.dtype, space: spaces.Space,
                    where: str, env_ids: np.ndarray | None) -> None:
        """InvalidActionError naming the leaf, the value and its env if an
        integer of array (rows of envs) does not fit dtype (compared exactly,
        as Python ints: no uint64/int64 promotion to float)."""
        limits = np.iinfo(dtype)
        if array.min() >= limits.min and array.max() <= limits.max:
            return
        rows = array.reshape(len(array), -1) if array.ndim else array.reshape(1, 1)
        row, column = (int(i[0]) for i in np.nonzero((rows < limits.min) | (rows > limits.max)))
        index = int(env_ids[row]) if env_ids is not None else row
        bounds = leaves.leaf_bounds(space)
        low, high = ((int(b.reshape(-1)[column]) for b in bounds) if bounds is not None
                     else (limits.min, limits.max))
        raise InvalidActionError(
            f"{self.env_id}: action{where} {int(rows[row, column])} of env {index} is out of "
            f"range; {space} accepts {low}..{high}")

    def _acquire(self) -> None:
        """Take the env for one call (give it back with
        ``self._claim.append(True)``), or raise if it is closed or in use."""
        claim = self._claim
        try:
            claim.pop()
        except IndexError:
            raise EnvStateError(
                f"this {self.env_id} VecEnv is being used by another thread; "
                "a VecEnv takes one call at a time") from None
        except BaseException as interrupt:  # (the claim's note: no call before the append)
            where = interrupt.__traceback__
            if not claim and where and where.tb_frame.f_code.co_code[where.tb_lasti] in _POP_CALLED:
                claim.append(True)
            raise
        if self._closing:
            self._claim.append(True)
            _refuse_closed(self.env_id)

    _EPISODE_STATS = ("episode_returns", "episode_lengths", "episode_times")

    def _done_info(self) -> dict[str, Any]:
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
        if self._episode_statistics:
            stats = tuple(a.copy() for a in stats)
        columns = self._log_columns
        if columns is not None:
            columns = {name: column.copy() for name, column in columns.items()}
        return self._episode_info(self._dones.copy(), self._final_obs, stats, columns)

    @property
    def num_env_instances(self) -> int:
        """Envs (num_envs counts rows: num_env_instances * num_agents)."""
        return self.num_envs // self.num_agents

    @property
    def num_agents_per_env(self) -> int:
        """Agents (rows) per env: num_envs == num_env_instances * num_agents_per_env."""
        return self.num_agents

    @property
    def possible_agents(self) -> list[str]:
        """The names of one env's agents, in row order (PettingZoo's
        possible_agents): row r is agent possible_agents[r % num_agents_per_env]
        of env r // num_agents_per_env."""
        return possible_agents(self.agent_names, self.num_agents)

    def _env_info_now(self) -> dict[str, np.ndarray]:
        """The env's info fields after a reset or step (and a multi-agent
        env's "agent_mask"): views, or copies with copy=True."""
        info = dict(self._env_info)
        if self._agent_mask is not None:
            info["agent_mask"] = self._agent_mask
        if self._copy:
            return {name: array.copy() for name, array in info.items()}
        return info

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
                final[k] = leaves.row_of(self.single_observation_space, final_rows, k)
            info["final_obs"], info["_final_obs"] = final, dones
            info["final_info"], info["_final_info"] = {}, dones
        key = self.episode_statistics_key
        if key is not None:  # (self._episode_statistics)
            info[key] = {"r": stats[0], "l": stats[1], "t": stats[2]}
            info["_" + key] = dones
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
        or, stepped in this process, the env's own dict (_inline_infos);
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
        inline = self._inline_infos
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

    def _reset_mask(self, options: dict[str, Any] | None) -> np.ndarray | None:
        if options is not None and not isinstance(options, dict):
            raise InvalidArgumentError(f"options must be a dict or None, got {type(options).__name__}")
        options = dict(options or {})
        mask = options.pop("reset_mask", None)
        if options:
            raise InvalidArgumentError(
                f"{self.env_id}: unsupported reset options {sorted(options)}; "
                "the only option is 'reset_mask'")
        if mask is not None and not (isinstance(mask, np.ndarray) and mask.dtype == np.bool_
                                     and mask.shape == (self.num_envs,) and mask.any()):
            raise InvalidArgumentError(
                f"options['reset_mask'] must be a bool numpy array of shape "
                f"({self.num_envs},) with at least one True value")
        return mask

    def _write_reset_inputs(self, seeds: np.ndarray | None, mask: np.ndarray | None) -> None:
        """Write a reset's seeds and mask (where given) into their buffers, once
        the buffers are free (called with the env acquired)."""
        if self._maybe_running:
            self._check_buffers_free()
        envs = self.num_env_instances  # a multi-agent env's inputs are per env
        if seeds is not None:
            self._buffers["reset_seeds"][:envs] = seeds
        if mask is not None:
            # a row selects its whole env (agents reset together)
            self._buffers["reset_mask"][:envs] = (mask if self.num_agents == 1 else
                                                  mask.reshape(envs, self.num_agents).any(1))

    # ---- gymnasium API -------------------------------------------------------------
    def reset(self, *, seed: int | Sequence[int] | np.ndarray | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset every env (or those in options["reset_mask"]); seed as in make
        (for a multi-agent env: one seed per env, not per row)."""
        mask = self._reset_mask(options)
        seeds = seed_list(seed, self.num_env_instances) if seed is not None else None
        self._acquire()
        try:
            self._write_reset_inputs(seeds, mask)
            self._last_num_done = None  # (step_info: no step to describe)
            self._stepper.reset(seeds is not None, mask is not None)
            info = self._env_info_now() if self._env_info or self._agent_mask is not None else {}
            if self._info_lengths is not None:
                self._add_env_infos(info, self._buffers, mask)
        finally:
            self._claim.append(True)
        return (leaves.copy_value(self._obs) if self._copy else self._obs), info

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        """Step every env; returns (obs, rewards, terminations, truncations, info)."""
        # The hot path: keep it to a few attribute lookups and one call
        # (_acquire's tests inline: a method call is a visible share of it).
        claim = self._claim
        try:
            claim.pop()
        except IndexError:
            self._acquire()  # (raises: in use by another thread)
        except BaseException as interrupt:  # (the claim's note: no call before the append)
            where = interrupt.__traceback__
            if not claim and where and where.tb_frame.f_code.co_code[where.tb_lasti] in _POP_CALLED:
                claim.append(True)
            raise
        if self._closing:  # (before the actions are written)
            claim.append(True)
            self._acquire()  # (raises: closed)
        try:
            if self._maybe_running:
                self._check_buffers_free()
            if (self._action_leaves is None and actions.__class__ is np.ndarray
                    and (actions.dtype is self._action_dtype
                         or actions.dtype == self._action_dtype)
                    and actions.shape == self._action_shape):
                self._actions[...] = actions
            else:
                self._convert_actions(actions)
            try:
                num_done = self._step_fn(self._step_arg)
                if num_done < 0:
                    self._step_failed(num_done)
            except BaseException:  # (envs may have stepped: step_info describes no step)
                self._last_num_done = None
                raise
            self._last_num_done = num_done
            info = self._done_info() if num_done else {}
            if self._more_info:
                self._add_more_info(info)
        finally:
            claim.append(True)
        if self._copy:
            return (leaves.copy_value(self._obs), self._rewards.copy(), self._terminations.copy(),
                    self._truncations.copy(), info)
        return self._obs, self._rewards, self._terminations, self._truncations, info

    def _add_more_info(self, info: dict[str, Any]) -> None:
        """Add a step's info beyond the episode info: the env's own fields
        and agent mask, and a hosted env's infos."""
        if self._env_info or self._agent_mask is not None:
            info.update(self._env_info_now())
        if self._info_lengths is not None:
            self._add_env_infos(info, self._buffers)

    # ---- in place (PufferLib's loop: buffers bound once) ---------------------------------
    # The arrays below are the env's own buffers, the same for its whole life
    # (a daemon-served env's: its shared memory).  step_in_place() steps
    # every env on what is in `actions` and leaves the results in the other
    # four; step() is the same step plus a copy of its actions in and the
    # info and tuple out.

    @property
    def actions(self) -> Any:
        """The action buffer, writable: one row per env (rows of a
        multi-agent env), the dtype of ``single_action_space`` (a Dict/Tuple
        space: a dict/tuple of views of its leaves).  Write the actions here,
        then call ``step_in_place()``.  Values are checked when the envs are
        stepped, as step()'s are (an out-of-range action is refused there)."""
        if self._action_leaves is None:
            return self._actions
        return leaves.unflatten(self.single_action_space, self._action_leaves)

    @property
    def observations(self) -> Any:
        """The observations of the last step or reset (the view step()
        returns; overwritten in place by the next)."""
        return self._obs

    @property
    def rewards(self) -> np.ndarray:
        """The rewards of the last step (the view step() returns)."""
        return self._rewards

    @property
    def terminations(self) -> np.ndarray:
        """The terminations of the last step (the view step() returns)."""
        return self._terminations

    @property
    def truncations(self) -> np.ndarray:
        """The truncations of the last step (the view step() returns)."""
        return self._truncations

    def step_in_place(self) -> int:
        """Step every env on the actions already in ``actions``: PufferLib's
        ``vec_step``.  The results are in ``observations``, ``rewards``,
        ``terminations`` and ``truncations`` (step()'s views); returns the
        number of episodes that ended, and ``step_info()`` builds the info
        step() would have returned.  The actions get step()'s checks: an
        action out of range raises step()'s error and steps no env."""
        # The hot path of PufferLib's loop: the bare native call (in process:
        # NativeSession.bare_step) between taking the env and giving it back.
        # A closed env's _step_fn raises that it is closed: nothing was
        # written before it, so the test of `closed` can wait until then.
        claim = self._claim
        try:
            claim.pop()
        except IndexError:
            self._acquire()  # (raises: in use by another thread)
        except BaseException as interrupt:  # (the claim's note: no call before the append)
            where = interrupt.__traceback__
            if not claim and where and where.tb_frame.f_code.co_code[where.tb_lasti] in _POP_CALLED:
                claim.append(True)
            raise
        try:
            if self._maybe_running and not self._closing:
                self._check_buffers_free()
            try:
                num_done = self._step_fn(self._step_arg)
                if num_done < 0:
                    self._step_failed(num_done)
            except BaseException:  # (envs may have stepped: step_info describes no step)
                self._last_num_done = None
                raise
            self._last_num_done = num_done
        finally:
            claim.append(True)
        return num_done

    def step_info(self) -> dict[str, Any]:
        """The info of the last step (step_in_place's, or step()'s): the dict
        step() returns, its arrays views valid until the next step or reset
        (copies with copy=True).  Raises if no step came since the last
        reset."""
        self._acquire()
        try:
            num_done = self._last_num_done
            if num_done is None:
                raise EnvStateError(f"{self.env_id}: step_info() describes a step: none "
                                    "since the last reset")
            info = self._done_info() if num_done else {}
            if self._more_info:
                self._add_more_info(info)
            return info
        finally:
            self._claim.append(True)

    # ---- async mode (EnvPool's names) ---------------------------------------------------
    # An env is IDLE (the trainer holds it: send it), IN_FLIGHT (being stepped)
    # or READY (stepped, waiting for recv).  recv returns the first batch_size
    # ready envs, in the order their sends finished; each env sent comes back
    # exactly once.  The stepper keeps these books (envd.stepping).

    def async_reset(self, *, seed: int | Sequence[int] | None = None) -> None:
        """Reset every env and mark them all ready: the next recv returns the
        first batch_size envs' initial observations (in env order).  Envs still
        in flight are waited for first and their results dropped."""
        seeds = seed_list(seed, self.num_env_instances) if seed is not None else None
        self._acquire()
        try:
            self._write_reset_inputs(seeds, None)
            self._last_num_done = None  # (step_info: no step to describe)
            # (the backend's reset writes each env's rows: reward 0, the
            # flags False: env_slot.c envd_slot_reset_rows, a hosted
            # worker's reset outputs; the inline transport writes its
            # private copies alike, a MultiVecEnv copies its shards')
            self._stepper.async_reset(seeds is not None)
        finally:
            self._claim.append(True)

    def send(self, actions: Any, env_ids: Any) -> None:
        """Start stepping the envs env_ids (each idle: received, not sent since)
        with actions (one row per env id); returns at once."""
        self._acquire()
        try:
            last = self._last_batch
            if last is not None and last.sends(env_ids):
                # the envs the last recv returned, as it returned them: in
                # range and each once (LastBatch)
                ids = row_ids = env_ids.astype(np.int64)
                target = row_ids if last.rows is None else last.rows
            else:
                ids = self._check_env_ids(env_ids)
                row_ids = target = self._rows_of(ids)
            if (self._action_leaves is None and actions.__class__ is np.ndarray
                    and (actions.dtype is self._action_dtype
                         or actions.dtype == self._action_dtype)
                    and actions.shape == (len(row_ids), *self._action_shape[1:])):
                rows = actions  # the hot path: nothing to convert (copied in below)
            else:
                rows = np.empty((len(row_ids), *self._action_shape[1:]), self._action_dtype)
                self._convert_actions(actions, rows, f"{len(row_ids)} env ids", row_ids)
            if self._maybe_running:
                self._check_buffers_free()
            self._check_send_rows(rows, ids)
            # (the stepper refuses an env not idle before it reads any row;
            # the vec steps from its own copy of the rows it accepted)
            self._actions[target] = rows
            self._last_num_done = None  # (step_info: no step to describe)
            self._stepper.send(ids)
        finally:
            self._claim.append(True)

    def _rows_of(self, ids: np.ndarray) -> np.ndarray:
        """The rows of envs ids (a multi-agent env's agents, agent-major)."""
        if self.num_agents == 1:
            return ids
        return (ids[:, None] * self.num_agents + np.arange(self.num_agents)).ravel()

    def _check_env_ids(self, env_ids: Any) -> np.ndarray:
        """The env ids of a send, checked (int64).  A multi-agent env takes
        them as recv returns them: per row, each env's id num_agents times in
        a row; the result has one id per env."""
        ids = np.asarray(env_ids)
        if ids.ndim != 1 or len(ids) == 0 or (ids.dtype.kind not in "iu"):
            raise InvalidArgumentError(
                f"{self.env_id}: env_ids must be a non-empty 1-D array of ints, got "
                f"{ids.dtype} with shape {ids.shape}")
        if self.num_agents > 1:
            grouped = ids.reshape(-1, self.num_agents) if len(ids) % self.num_agents == 0 else None
            if grouped is None or (grouped != grouped[:, :1]).any():
                raise InvalidArgumentError(
                    f"{self.env_id}: env_ids of a multi-agent env are per row, each env's id "
                    f"{self.num_agents} times in a row (as recv's info['env_id'])")
            ids = grouped[:, 0]
        return self._checked_ids(ids)

    def _checked_ids(self, ids: np.ndarray) -> np.ndarray:
        """A send's env ids (1-D, integer, one per env) checked for range and
        repeats, as a new int64 array.  (The in-process env does it in one
        native call and comes here only to raise.)"""
        envs = self.num_env_instances
        low, high = ids.min(), ids.max()
        if low < 0 or high >= envs:
            raise InvalidArgumentError(
                f"{self.env_id}: env ids must be in [0, {envs}), got "
                f"{low if low < 0 else high}")
        ids = ids.astype(np.int64)  # (a copy: the caller may reuse its array)
        if self._repeat_check.repeats(ids):
            raise InvalidArgumentError(f"{self.env_id}: env_ids has repeated ids")
        return ids

    def recv(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """The first batch_size envs found finished: (obs, rewards, terminations,
        truncations, info) with info["env_id"] (int32) naming them.  Blocks until
        that many are ready; raises at once if fewer are in flight or ready.
        The arrays stay valid until the second recv after this one (two buffers
        alternate), so the trainer may compute on one batch while the next
        is stepped; copy=True returns copies."""
        self._acquire()
        try:
            if self._maybe_running:
                self._check_buffers_free()
            self._last_num_done = None  # (step_info: no step to describe)
            ids = self._stepper.recv(self.batch_size)
            return self._gather(ids)
        finally:
            self._claim.append(True)

    #: gathered only for a batch in which an episode ended (only then in its
    #: info; the leaves "final_observations.<k>" of a composite space too)
    _ON_DONE = frozenset({*_EPISODE_STATS, "final_observations", EPISODE_LOG})

    def _gather(self, ids: np.ndarray, source: int = 0,
                source_rows: np.ndarray | None = None) -> tuple:
        """Copy the envs' results into the next of two batch buffers, from
        buffer set `source` of _gather_sources() (source_rows: the envs'
        rows there; by default their rows in this env's own buffers)."""
        plan = self._gather_plans()[self._recv_count % 2]
        self._recv_count += 1
        rows = self._rows_of(ids)
        # (rows come from the stepper's ids: in range)
        copy_always, copy_on_done = plan.copiers[source]
        read = rows if source_rows is None else source_rows
        run = run_of(read, self._positions)
        copy_always(read, run)
        any_done = plan.dones.any()
        if any_done:  # (no episode ended: the info has no statistics)
            copy_on_done(read, run)
        env_id = plan.slots["env_id"]
        if self.num_agents == 1:
            env_id[...] = rows
            self._last_batch = LastBatch(env_id, run if source_rows is None else run_of(
                rows, self._positions))
        else:
            env_id[...] = rows // self.num_agents  # each row's env
        if self._copy:
            out = {name: slot.copy() for name, slot in plan.slots.items()
                   if any_done or name not in plan.on_done_names}
            obs = self._tree(out, "observations")
        else:
            out = plan.slots
            obs = plan.obs if plan.obs is not None else self._tree(out, "observations")
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
            columns = (None if log is None or not self.episode_fields else
                       dict(zip(self.episode_fields, ended_columns(log, out["dones"]))))
            info.update(self._episode_info(out["dones"], final,
                                           tuple(out[name] for name in self._EPISODE_STATS),
                                           columns))
        if self._info_lengths is not None:
            self._add_env_infos(info, out, env_ids=out["env_id"])
        return obs, out["rewards"], out["terminations"], out["truncations"], info

    def _gather_plans(self) -> list[GatherPlan]:
        """Two sets of batch_size-row buffers recv alternates between, each
        with the copies that fill it (made once: a recv's hot path)."""
        plans = self._plans
        if plans is None:
            names = [*self._obs_names, "rewards", "terminations", "truncations", "dones",
                     *self._EPISODE_STATS]
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
            rows = self.batch_size * self.num_agents  # batch_size counts envs
            plans = self._plans = []
            for _ in range(2):
                slots = {**{name: np.empty((rows, *self._buffers[name].shape[1:]),
                                           self._buffers[name].dtype) for name in names},
                         "env_id": np.empty(rows, np.int32)}
                # gathered only for a batch in which an episode ended (only
                # then in its info; the leaves of a composite space's
                # final_observations too)
                on_done = [name for name in names if name in self._ON_DONE
                           or name.startswith("final_observations.")]
                always = [name for name in names if name not in on_done]
                obs = self._tree(slots, "observations")
                copiers = [(self._row_copier([(source[n], slots[n]) for n in always]),
                            self._row_copier([(source[n], slots[n]) for n in on_done]))
                           for source in self._gather_sources()]
                plans.append(GatherPlan(
                    slots, frozenset(on_done), obs if isinstance(obs, np.ndarray) else None,
                    copiers))
        return plans

    def _gather_sources(self) -> list[dict[str, np.ndarray]]:
        """The buffer sets a recv may gather its batch from (name -> array,
        as this env's own): this env's own (source 0); a MultiVecEnv adds
        its shards' (a batch of one shard is copied once, from there)."""
        return [self._buffers]

    def _row_copier(self, pairs: list[tuple[np.ndarray, np.ndarray]]) -> Any:
        """A function of (rows, run) copying rows (int64, in range) of each
        (buffer, slot) pair's buffer into its slot, in order; run: the same
        rows as a slice (run_of), or None."""
        def copy(rows: np.ndarray, run: slice | None) -> None:
            if run is not None:  # (a third of a take's cost)
                for buffer, slot in pairs:
                    slot[...] = buffer[run]
                return
            for buffer, slot in pairs:
                # mode="clip" skips numpy's bounds check, which with out=
                # (mode "raise") copies through a temporary buffer -- about
                # half of a recv's own time for cheap envs.
                buffer.take(rows, axis=0, out=slot, mode="clip")
        return copy

    def render(self) -> tuple[np.ndarray, ...]:
        """One rgb_array frame per env, as gymnasium's vector envs return them: a
        tuple of num_env_instances (height, width, 3) uint8 arrays (num_envs for
        single-agent envs; a multi-agent env draws all its agents in one frame),
        drawn from the envs' current states.  Each call returns new arrays (a recorder may keep
        them).  Needs render_mode="rgb_array" at make and no env sent and
        not received yet."""
        if self.render_mode is None:
            raise EnvStateError(
                f"this {self.env_id} VecEnv was made without a render mode; make it with "
                "render_mode='rgb_array' to render")
        self._acquire()
        try:
            frames = self._render_frames()
        finally:
            self._claim.append(True)
        return tuple(frames)

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """gymnasium's per-env call: hosted Python envs have it (HostedVecEnv,
        RemoteVecEnv); a built-in C env has no per-env Python object, so it
        is refused (InvalidArgumentError) with where to look instead."""
        raise InvalidArgumentError(
            f"{self.env_id}: call, get_attr and set_attr reach hosted Python envs only; a "
            "built-in env's VecEnv has spec, metadata and the spaces (env.spec, "
            "env.metadata, env.single_observation_space, ...)")

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Each env's attribute (call(name)); see call."""
        return self.call(name)

    def set_attr(self, name: str, values: Any) -> None:
        """Set each env's attribute; see call."""
        self.call(name)

    def close(self, **kwargs: Any) -> None:
        """Free the envs.  Idempotent; waits for a call in progress on another
        thread, at most _CLOSE_WAIT_S: then it warns and leaks the env's
        native session instead of freeing memory the call may still be in."""
        self._close(wait=True)

    def _close(self, wait: bool) -> None:
        """close(); wait=False (garbage collection) frees the envs even when
        the token is gone: no call runs, since its frame would hold self."""
        claim = getattr(self, "_claim", None)
        if claim is None:  # __init__ failed before creating anything
            return
        if self.closed and not claim:  # (closed, or leaked by _leak: nothing to wait for)
            return
        # Refuse every call from now on, first: a thread stepping in a loop
        # takes the env back between two calls without letting this thread
        # run (the GIL), so close() must not wait for a moment between calls.
        self._closing = True
        self._step_fn = _RefuseClosing(self.env_id)
        deadline = time.monotonic() + _CLOSE_WAIT_S
        while True:  # (a call holds the env for as long as it runs)
            try:
                claim.pop()
                break
            except IndexError:
                if not wait:  # (the token was lost: given back below)
                    break
                if time.monotonic() >= deadline:
                    if not self.closed:
                        self._leak()
                    return
                time.sleep(_CLOSE_POLL_S)
            except BaseException as interrupt:  # (the claim's note: no call before the append)
                where = interrupt.__traceback__
                if not claim and where and where.tb_frame.f_code.co_code[where.tb_lasti] in _POP_CALLED:
                    claim.append(True)
                raise
        try:
            # (before what they call is freed)
            self._step_fn, self._step_arg = _refuse_closed, self.env_id
            self._step_failed = _unexpected_step_result
            self._release()
            self.closed = True
        finally:
            claim.append(True)
        # taken before closing them: an owned client closes this env back
        owned, self._owned = self._owned, []
        for resource in owned:
            resource.close()

    def _leak(self) -> None:
        """close() after _CLOSE_WAIT_S without the env back: a call still
        runs (or an interrupt under a tracer lost the token): keep the env
        and its native session alive for good, closed to every new call."""
        self._step_fn, self._step_arg = _refuse_closed, self.env_id
        self.closed = True
        _LEAKED.append(self)
        warnings.warn(
            f"{self!r}: close() waited {_CLOSE_WAIT_S:g} s for a call in progress on "
            "another thread (or for the env's one-call token, lost to an interrupt "
            "under a debugger, profiler or coverage tool); the env's native session "
            "is leaked, not freed, since the call may still use it", RuntimeWarning,
            stacklevel=4)

    def close_along(self, resource: Any) -> None:
        """Close resource (anything with close(), e.g. the envd.Client this
        env was made through) when this env closes: for an env whose maker
        opened the connection for it (gymnasium.make_vec("envd/...",
        endpoint=...)), so that closing the env leaks nothing."""
        self._owned.append(resource)

    def __del__(self) -> None:
        self._close(wait=False)

    def __enter__(self) -> BatchedVecEnv:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
