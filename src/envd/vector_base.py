"""What the in-process and the daemon-served VecEnv share: the gymnasium API.

Both are N envs stepped over one set of batch buffers (numpy arrays in the
process, or views of a session's shared memory); they differ only in who runs
a reset or a step: the native core in this process, or the daemon.  Keeping
argument checks, action conversion, the info dict and the view/copy rules
here makes the two behave the same by construction.  The class itself holds
the calls (argument checks, action conversion, the one-call claim, close);
what it composes or shares with the client and the daemon lies in modules of
one idea each: the buffers (envd.buffer_layout), the info and its assembly
(envd.vec_info.InfoBuilder, one per bound set of buffers), a batch's rows and
recv's gather plans (envd.vec_rows), the errors (envd.vec_errors), a send's
range checks (envd.send_row_checks), autoreset modes (envd.autoreset) and
integer arguments (envd.int_args).

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

from envd import leaves
from envd.errors import EnvStateError, InvalidActionError, InvalidArgumentError, NativeError
from envd.int_args import seed_list
from envd.stepping import NO_STEPPER, Stepper
from envd.vec_info import INFO_PREFIX, InfoBuilder, episode_statistics_key, gathered_on_done
from envd.vec_rows import (
    GatherPlan,
    LastBatch,
    RepeatCheck,
    RowCopy,
    gather_plans,
    numpy_row_copier,
    run_of,
)


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
        #: episodes ended in the last step (step_info's), None since a reset
        #: or async call
        self._last_num_done: int | None = None

    def _bind_buffers(self, buffers: dict[str, np.ndarray]) -> None:
        self._buffers = buffers
        self._plans: list[GatherPlan] | None = None  # recv's, over these buffers (built lazily)
        space = self.single_observation_space
        self._obs_names = leaves.leaf_names("observations", space)
        self._obs = self._tree(buffers, "observations")
        self._actions = buffers["actions"]
        # a Dict/Tuple action space: its leaves, views of the packed rows
        self._action_leaves = (leaves.leaf_views(self.single_action_space, self._actions)
                               if leaves.is_composite(self.single_action_space) else None)
        self._rewards = buffers["rewards"]
        self._terminations = buffers["terminations"]
        self._truncations = buffers["truncations"]
        self._dones = buffers["dones"]
        self._check_episode_statistics_key(buffers)
        #: the infos of the results (a hosted env stepped in this process
        #: sets its inline_infos)
        self._infos = InfoBuilder(buffers, space, self.episode_statistics_key,
                                  self.episode_fields, self._copy)
        # the fast path of step() compares against these (a builtin dtype is
        # one object: the identity test spares the slower == per step)
        self._action_dtype, self._action_shape = self._actions.dtype, self._actions.shape
        # whether a step's info has more than the episode info (one test a step)
        self._more_info = self._infos.more_info

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
            info = self._infos.reset_info(mask)
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
            info = self._infos.done_info() if num_done else {}
            if self._more_info:
                self._infos.add_more_info(info)
        finally:
            claim.append(True)
        if self._copy:
            return (leaves.copy_value(self._obs), self._rewards.copy(), self._terminations.copy(),
                    self._truncations.copy(), info)
        return self._obs, self._rewards, self._terminations, self._truncations, info

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
            info = self._infos.done_info() if num_done else {}
            if self._more_info:
                self._infos.add_more_info(info)
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

    def _gather(self, ids: np.ndarray, source: int = 0,
                source_rows: np.ndarray | None = None) -> tuple:
        """Copy the envs' results into the next of two batch buffers, from
        buffer set `source` of _gather_sources() (source_rows: the envs'
        rows there; by default their rows in this env's own buffers)."""
        plan = self._gather_plans()[self._recv_count % 2]
        self._recv_count += 1
        rows = self._rows_of(ids)
        # (rows come from the stepper's ids: in range)
        out, any_done, run = plan.fill(rows, source, rows if source_rows is None else source_rows,
                                       self._positions, self.num_agents, self._copy)
        if self.num_agents == 1:
            self._last_batch = LastBatch(out["env_id"], run if source_rows is None else run_of(
                rows, self._positions))
        obs = (plan.obs if plan.obs is not None and not self._copy else
               self._tree(out, "observations"))
        info = self._infos.recv_info(out, any_done)
        return obs, out["rewards"], out["terminations"], out["truncations"], info

    def _gather_plans(self) -> list[GatherPlan]:
        """Two sets of batch_size-row buffers recv alternates between, each
        with the copies that fill it (made once: a recv's hot path)."""
        plans = self._plans
        if plans is None:
            names = [*self._obs_names, "rewards", "terminations", "truncations", "dones",
                     *self._infos.gathered_names()]
            plans = self._plans = gather_plans(
                self._buffers, names, gathered_on_done,
                self.batch_size * self.num_agents,  # (batch_size counts envs)
                self._gather_sources(), self._row_copier,
                lambda slots: self._tree(slots, "observations"))
        return plans

    def _gather_sources(self) -> list[dict[str, np.ndarray]]:
        """The buffer sets a recv may gather its batch from (name -> array,
        as this env's own): this env's own (source 0); a MultiVecEnv adds
        its shards' (a batch of one shard is copied once, from there)."""
        return [self._buffers]

    def _row_copier(self, pairs: list[tuple[np.ndarray, np.ndarray]]) -> RowCopy:
        """The copy of rows of each (buffer, slot) pair's buffer into its
        slot that recv's plans use (numpy_row_copier; the in-process env's
        is native)."""
        return numpy_row_copier(pairs)

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
