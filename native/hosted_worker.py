"""The worker side of a hosted session: a slice of Python envs stepped over
the shared segment (native/hosted_segment.py), gymnasium's SyncVectorEnv
loop without books.

``EnvSlice.run_pending`` runs every env of its slice whose request word
differs from its ack (backend_workers.h) as its kind word says, reading a
step's action from the parent's checked copy and writing the observation,
the raw reward, terminated and truncated flags the env returned (0, False,
False for a reset) and the info in place, then acks it.  It runs in a
worker process (``serve``, woken through the futex words of its control
block) or, with num_workers=0, in the caller itself (the backend's inline
callback).

The rules are the parent's (native/src/env_slot.h, applied by
backend_workers.c as the acks come in): the refusals, the autoreset modes
(a NEXT_STEP autoreset arrives as a reset request; a SAME_STEP step has
the RESET_IF_DONE flag, and the worker then writes a done step's final
observation and resets the env at once), the episode statistics and dones.
An exception in reset or step marks the env ENVD_EENV and leaves
"ExcType: message" in the worker's control block.

Spaces and infos (envd.leaves, envd.info_codec): an observation is written
leaf by leaf into its buffers, an action is read from the checked copy's
packed row as the env's action space has it (a dict for a Dict...), and
each env's info after every reset and step goes msgpack-encoded into its
slot ([info], or [info, final step info] for a SAME_STEP done env; length 0
when both are empty).  An info that does not fit its slot or holds a type
msgpack cannot carry fails the env's call like an exception of the env.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, cast

import gymnasium
import numpy as np
from gymnasium.vector import AutoresetMode

from envd import info_codec, leaves
from envd.cpus import usable_cpus
from envd.errors import NATIVE_CODES
from envd.native._envd_native import lib
from envd.native.hosted_segment import Segment
from envd.vec_info import INFO_COLUMN_PREFIX, INFO_IN_COLUMNS

EENV = NATIVE_CODES["EENV"]
RESET, RESET_IF_DONE = lib.ENVD_HOSTED_RESET, lib.ENVD_HOSTED_RESET_IF_DONE

#: How long the parent and the workers spin for each other before they sleep
#: on the futex, when there is a CPU for every spinner (spin_ns()).  Short:
#: on a busy 2-CPU machine a no-op env's step with 1 worker took 108 us with
#: a 50 us spin (a preempted spinner wastes its partner's slice) and 12 us
#: with 1 us, against 11.6 us with none (docs/python-envs.md, "Workers").
SPIN_NS = 1_000


def spin_ns(num_workers: int) -> int:
    """The spin of a session's parent and workers: SPIN_NS while the workers
    and the parent fit the usable CPUs (envd.cpus: affinity and cgroup
    quota), else 0: they sleep on the futex at once (more spinners than
    CPUs would take the CPU from the process that has work: DESIGN.md
    section 6)."""
    return SPIN_NS if num_workers + 1 <= usable_cpus() else 0


#: The values an output view is filled with: numbers, which ndarray.fill
#: takes as an assignment does (anything else, a 0-d array say, is assigned).
_FILLABLE = (bool, int, float, np.number, np.bool_)
#: The type tuples an EnvSlice remembers as fitting its columns (an env
#: mixing float and numpy float64 values could otherwise grow the set).
_MAX_FITTING_TYPES = 16
#: An int goes in an int64 column only inside its range.
_INT_BOUND = 1 << 63


def _column_types(dtype: np.dtype) -> tuple[type, ...]:
    """The types of a value that go in a column of dtype: those gymnasium's
    _add_info batches as that dtype (np.zeros(n, dtype=type(value)))."""
    if dtype == np.float64:
        return float, np.float64
    if dtype == np.int64:
        return int, np.int64
    if dtype == np.bool_:
        return (bool,)  # (a numpy bool makes an object array)
    return (dtype.type,)


#: Info columns need this many steps of an env whose infos agree (the
#: steps the env's description takes, native/step_cost.py), and are at
#: most this many, each key at most this long, all of an env's values at
#: most this many bytes (the columns are part of the session's segment:
#: SECURITY.md).
INFO_COLUMN_MIN_STEPS = 8
MAX_INFO_COLUMNS = 64
MAX_INFO_COLUMN_KEY = 128
MAX_INFO_COLUMN_BYTES = 4096


def _column_of(value: Any) -> tuple[str, tuple[int, ...]] | None:
    """(dtype str, shape) of the column a value goes in, or None: Python's
    bool, int and float, numpy's numbers, numeric numpy arrays (what
    gymnasium's _add_info batches as a numeric array)."""
    kind = type(value)
    if kind in (bool, int, float) or (issubclass(kind, np.number)
                                      and np.dtype(kind).kind in "iufc"):
        return np.dtype(kind).str, ()
    if kind is np.ndarray and value.dtype.kind in "biufc":
        return value.dtype.str, value.shape
    return None


def info_columns(infos: list[dict]) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
    """The info columns ((key, dtype str, shape)) of an env whose steps gave
    infos: none unless every info has the same str keys, each with a value
    of the same column (_column_of: type, dtype and shape), over at least
    INFO_COLUMN_MIN_STEPS steps.  A later step of the env whose info
    deviates from them has it encoded (EnvSlice._info_outputs)."""
    if len(infos) < INFO_COLUMN_MIN_STEPS or not infos[0] \
            or len(infos[0]) > MAX_INFO_COLUMNS:
        return ()
    first = {key: (type(value), _column_of(value)) for key, value in infos[0].items()}
    if any(not isinstance(key, str) or len(key) > MAX_INFO_COLUMN_KEY or column is None
           for key, (_, column) in first.items()):
        return ()
    # (every key has a column: refused above otherwise)
    columns = cast("dict[str, tuple[type, tuple[str, tuple[int, ...]]]]", first)
    if sum(np.dtype(d).itemsize * int(np.prod(shape)) for _, (d, shape) in columns.values()) \
            > MAX_INFO_COLUMN_BYTES:
        return ()
    for info in infos[1:]:
        if len(info) != len(columns) or any(
                key not in info or type(info[key]) is not kind or _column_of(info[key]) != column
                for key, (kind, column) in columns.items()):
            return ()
    return tuple((key, dtype, shape) for key, (_, (dtype, shape)) in columns.items())


#: The types of a flag an env may return (bool of it is the flag): a numpy
#: bool or a number, as gymnasium's envs do.
_FLAG_TYPES = (bool, int, float, np.bool_, np.number)


def env_flag(value: Any, name: str) -> bool:
    """An env's terminated or truncated flag (name: "its terminated", ...)
    as the bool the parent reads (the byte numpy stores): a scalar's truth;
    anything else (a list, an array, a string, an object of its own) is the
    env's TypeError, never a truth Python and numpy could disagree on
    (``[0]`` is true to Python, stored as False), nor a value numpy fails to
    store outside the env's call."""
    if not isinstance(value, _FLAG_TYPES):
        raise TypeError(f"{name} flag is a {type(value).__name__}, not a bool")
    return bool(value)


def env_maker(env: str | gymnasium.envs.registration.EnvSpec | Callable[[], gymnasium.Env],
              max_episode_steps: int | None,
              env_kwargs: dict[str, Any]) -> Callable[[], gymnasium.Env]:
    """A function making one env: gymnasium.make(env id or EnvSpec) (with the
    id's time limit, or max_episode_steps), or the creator callable's env
    (wrapped in a TimeLimit when max_episode_steps is given)."""
    if isinstance(env, (str, gymnasium.envs.registration.EnvSpec)):
        kwargs = dict(env_kwargs)
        if max_episode_steps is not None:
            kwargs["max_episode_steps"] = max_episode_steps
        return lambda: gymnasium.make(env, **kwargs)

    def make() -> gymnasium.Env:
        made = env()
        if not isinstance(made, gymnasium.Env):
            raise TypeError(f"the env creator returned {type(made).__name__}, not a gymnasium.Env")
        if max_episode_steps is not None:
            made = gymnasium.wrappers.TimeLimit(made, max_episode_steps)
        return made
    return make


class EnvSlice:
    """Envs [begin, end) of a hosted session over segment (worker: its
    control block's index, where messages go)."""

    def __init__(self, make_env: Callable[[], gymnasium.Env], begin: int, end: int,
                 segment: Segment, worker: int, autoreset_mode: AutoresetMode,
                 inline: bool = False):
        """inline: stepped in the caller (num_workers=0): each env's info
        stays the env's own dict, in inline_infos (nothing is encoded)."""
        self.begin, self.end, self.worker = begin, end, worker
        self.segment = segment
        a = segment.arrays
        self._kind, self._req, self._ack, self._status = a["kind"], a["req"], a["ack"], a["status"]
        self._seeds, self._seed_pending = a["seeds"], a["seed_pending"]
        self._actions = a["checked_actions"]
        self._slots, self._info_lengths = a.get("infos"), a.get("info_lengths")
        n = end - begin
        self.inline_infos: list[Any] | None = [None] * n if inline else None
        # The info columns (envd.vec_info.INFO_COLUMN_PREFIX): (key, the
        # types a value may have to go in it); the outputs of a step, in the
        # order _step_outputs returns them.
        self._columns = [(name[len(INFO_COLUMN_PREFIX):], _column_types(a[name].dtype),
                          a[name].dtype, a[name].shape[1:])
                         for name in a if name.startswith(INFO_COLUMN_PREFIX)]
        self._array_columns = any(shape for _, _, _, shape in self._columns)
        self._int_columns = any(int in types for _, types, _, _ in self._columns)
        self._column_keys = tuple(key for key, _, _, _ in self._columns)
        # The tuples of value types (in the columns' order) seen to fit the
        # scalar columns: an env returns the same types step after step, so
        # a step's check is one tuple lookup (_fits_columns).
        self._fitting_types: set[tuple[type, ...]] = set()
        # (an env whose info is not in the columns: zeros of each column's row shape)
        self._no_columns = ((False, *(np.zeros(shape, dtype) for _, _, dtype, shape
                                      in self._columns)) if self._columns else ())
        self._no_info = (0, *self._no_columns)
        # The outputs after (reward, term, trunc) of a step with an empty
        # info (run_pending's common step).
        self._empty_info = () if self._info_lengths is None else self._no_info
        # (the raw outputs: the parent writes the rest of the rows, env_slot.h)
        self._outputs = [a[name] for name in ("rewards", "terminations", "truncations")]
        if self._info_lengths is not None:
            self._outputs.append(self._info_lengths)
            if self._columns:
                self._outputs += [a[INFO_IN_COLUMNS], *(a[INFO_COLUMN_PREFIX + key]
                                                        for key, _, _, _ in self._columns)]
        self._output_views = [buffer[begin:end] for buffer in self._outputs]
        self.envs: list[gymnasium.Env] = []
        try:
            for _ in range(n):
                self.envs.append(make_env())
            # the spaces as the vector env's: its first env's (SyncVectorEnv's single spaces)
            self._obs_space = self.envs[0].observation_space if self.envs else None
            self._action_space = self.envs[0].action_space if self.envs else None
        except BaseException:
            self.close()
            raise
        self._obs = self._leaf_buffers(a, "observations")
        # (one buffer: written directly, the common case)
        self._single_obs = self._obs[0] if len(self._obs) == 1 else None
        # (SAME_STEP's done steps: the only mode with final observations)
        self._final_obs = (self._leaf_buffers(a, "final_observations")
                           if autoreset_mode is AutoresetMode.SAME_STEP else None)
        self._composite_actions = (self._action_space is not None
                                   and leaves.is_composite(self._action_space))

    def _leaf_buffers(self, arrays: dict[str, np.ndarray], prefix: str) -> list[np.ndarray]:
        if self._obs_space is None:
            return []
        return [arrays[name] for name in leaves.leaf_names(prefix, self._obs_space)]

    def _write_obs(self, buffers: list[np.ndarray], i: int, obs: Any) -> None:
        if len(buffers) == 1:
            buffers[0][i] = obs
            return
        # (an env whose observation does not match its space: a ValueError of the env;
        # the space is set: a slice with an env to write has a first env)
        space = cast("gymnasium.spaces.Space[Any]", self._obs_space)
        for buffer, value in zip(buffers, leaves.flatten(space, obs, "its observation", ValueError)):
            buffer[i] = value

    def _info_outputs(self, i: int, k: int, info: dict, final_info: dict | None = None
                      ) -> tuple:
        """Env i's (the slice's k-th) info (and a SAME_STEP done env's final
        step info) as the outputs after the step's: (slot length[, in
        columns, column values...]).  Its row of the columns when it has
        exactly their keys with their types (and no final info: the merge
        then batches the columns at once, not env by env), else its slot,
        msgpack-encoded (length 0: nothing to say); in the caller's process
        the dicts themselves, in inline_infos (length 1: something)."""
        if (self._columns and final_info is None and info.__class__ is dict
                and len(info) == len(self._columns)):
            values = list(map(info.get, self._column_keys))
            if self._fits_columns(values):
                return (0, True, *values)
        if not (info or final_info):
            return self._no_info  # (length 0: an inline env's old dict is never read)
        if self.inline_infos is not None:
            self.inline_infos[k] = [info, final_info] if final_info else [info]
            return (1, *self._no_columns)
        try:
            data = info_codec.encode([info, final_info] if final_info else [info])
        except TypeError as exc:
            raise TypeError(f"the info of env {i} holds {exc}") from None
        # (an env with infos has info slots: buffer_layout gives both or neither)
        slots = cast(np.ndarray, self._slots)
        if len(data) > slots.shape[1]:
            raise ValueError(f"the info of env {i} is {len(data)} bytes encoded, over its "
                             f"{slots.shape[1]}-byte slot (make's info_bytes)")
        slots[i, :len(data)] = np.frombuffer(data, np.uint8)
        return (len(data), *self._no_columns)

    def _fits_columns(self, values: list) -> bool:
        """Whether an info's values (in the columns' order) go in them."""
        if not self._array_columns:
            kinds = tuple(map(type, values))
            if kinds not in self._fitting_types:
                if not all(kind in types for kind, (_, types, _, _) in zip(kinds, self._columns)):
                    return False
                if len(self._fitting_types) < _MAX_FITTING_TYPES:
                    self._fitting_types.add(kinds)
        else:
            for value, (_, types, dtype, shape) in zip(values, self._columns):
                if shape:
                    if not (type(value) is np.ndarray and value.dtype == dtype
                            and value.shape == shape):
                        return False
                elif type(value) not in types:
                    return False
        return not self._int_columns or all(-_INT_BOUND <= value < _INT_BOUND
                                            for value in values if type(value) is int)

    def run_pending(self) -> None:
        """Run every requested env of the slice, then ack them.  The outputs
        are gathered in lists and written with one numpy assignment per
        buffer (per-env numpy scalar writes cost as much as a cheap env's
        step).  The common step (an empty info, not done, one observation
        buffer) is done in the loop itself: this loop is what a worker pays
        per env beyond the env's own step, as gymnasium's SyncVectorEnv pays
        its own."""
        b, e = self.begin, self.end
        pending = pending_requests(self._req[b:e], self._ack[b:e])
        if not pending:
            return
        first, last = pending[0], pending[-1]
        # (consecutive envs, a whole step's among them: a slice, no index array)
        consecutive = last - first + 1 == len(pending)
        ids = slice(b + first, b + last + 1) if consecutive else np.array(pending) + b
        kinds = self._kind[ids].tolist()
        actions = self._actions[ids].copy()  # (rows stay valid for the env)
        if self._composite_actions:  # the leaves of each row, as the env's space has them
            space = cast("gymnasium.spaces.Space[Any]", self._action_space)  # (composite: set)
            views = leaves.leaf_views(space, actions)
            actions = [leaves.unflatten(space, [view[j] for view in views])
                       for j in range(len(kinds))]
        envs, single_obs, empty_info = self.envs, self._single_obs, self._empty_info
        stepped: list[int] = []
        results: list[tuple] = []  # (reward, term, trunc[, info outputs])
        for j, k in enumerate(pending):
            i = b + k
            kind = kinds[j]
            try:
                if kind == RESET:
                    result = self._reset(i, k)
                else:
                    obs, reward, term, trunc, info = envs[k].step(actions[j])
                    # (a number here: a reward numpy cannot store fails this env, not the loop)
                    reward = float(reward)
                    # (the flags as the bytes the parent reads, once: a SAME_STEP reset is
                    # decided from them, and an odd flag fails this env, not the loop)
                    if term.__class__ is not bool or trunc.__class__ is not bool:
                        term = env_flag(term, "its terminated")
                        trunc = env_flag(trunc, "its truncated")
                    if (term or trunc or single_obs is None or info.__class__ is not dict
                            or info):
                        result = self._step_outputs(i, k, kind, obs, reward, term, trunc, info)
                    else:
                        single_obs[i] = obs
                        result = (reward, term, trunc, *empty_info)
                stepped.append(i)
                results.append(result)
            except Exception as exc:  # noqa: BLE001 -- the env's own code: reported, never fatal
                self._status[i] = EENV
                self._report(i, f"{type(exc).__name__}: {exc}")
        if len(stepped) == e - b:
            # The whole slice, the common case: its views of the buffers, a
            # column of one value (most are: the info lengths, False flags,
            # CartPole's rewards, ...) written as one, a number with fill
            # (half an assignment's cost).
            for view, column in zip(self._output_views, zip(*results)):
                value = column[0]
                if view.ndim == 1 and column.count(value) == len(column):
                    if isinstance(value, _FILLABLE):
                        view.fill(value)
                    else:
                        view[:] = value
                else:
                    view[:] = column
        elif stepped:
            # (a slice assigns several times faster than a list)
            rows = (slice(stepped[0], stepped[-1] + 1)
                    if stepped[-1] - stepped[0] + 1 == len(stepped) else stepped)
            for buffer, column in zip(self._outputs, zip(*results)):
                # (a column of one value: a scalar assignment is 3x cheaper)
                if buffer.ndim == 1 and column.count(column[0]) == len(column):
                    buffer[rows] = column[0]
                else:
                    buffer[rows] = column
        lib.envd_worker_fence()  # the outputs before the acks (backend_workers.h)
        self._ack[ids] = self._req[ids]

    def _report(self, i: int, text: str) -> None:
        report(self.segment, self.worker, i, text)

    def _reset(self, i: int, k: int) -> tuple:
        """Reset env i (the slice's k-th), with its seed if one is pending (a
        reset request, or NEXT_STEP's autoreset: a seed is pending only
        before an env's first reset, which is never an autoreset); its
        observation written, its outputs as _step_outputs' (a fresh episode
        has earned nothing)."""
        seed = None
        if self._seed_pending[i]:
            seed, self._seed_pending[i] = int(self._seeds[i]), 0
        obs, info = self.envs[k].reset(seed=seed)
        self._write_obs(self._obs, i, obs)
        if self._info_lengths is None:
            return (0.0, False, False)
        return (0.0, False, False, *self._info_outputs(i, k, info))

    def _step_outputs(self, i: int, k: int, kind: int, obs: Any, reward: float, term: bool,
                      trunc: bool, info: Any) -> tuple:
        """The outputs of env i's (the slice's k-th) step, whose kind word
        was kind, but the observation (written here): with RESET_IF_DONE
        (SAME_STEP) a step that ends the episode writes the final
        observation and resets the env at once."""
        final_info = None
        if kind & RESET_IF_DONE and (term or trunc):
            self._write_obs(cast("list[np.ndarray]", self._final_obs), i, obs)
            final_info = info
            obs, info = self.envs[k].reset()
        if self._single_obs is not None:
            self._single_obs[i] = obs
        else:
            self._write_obs(self._obs, i, obs)
        if self._info_lengths is None:
            return (reward, term, trunc)
        return (reward, term, trunc, *self._info_outputs(i, k, info, final_info))

    def close(self) -> None:
        """Close the envs (errors in an env's close are ignored: it is going)."""
        envs, self.envs = self.envs, []
        close_envs(envs)


def pending_requests(req: np.ndarray, ack: np.ndarray) -> list[int]:
    """The envs of a slice (indices into its views of the req and ack
    words) asked something not acked yet; once there are some, after the
    acquire fence that orders their inputs (kind, seeds, actions) after
    the req words read here: the parent wrote those before its release
    store of req."""
    # (lists: a few short lists cost a fraction of numpy's compare and
    # flatnonzero, and a worker wakes once per vector step)
    asked, acked = req.tolist(), ack.tolist()
    if asked == acked:
        return []
    pending = [k for k, (r, a) in enumerate(zip(asked, acked)) if r != a]
    lib.envd_worker_acquire()
    return pending


def close_envs(envs: list[Any]) -> None:
    """Close envs (errors in an env's close are ignored: it is going)."""
    for env in envs:
        try:
            env.close()
        except Exception:  # noqa: BLE001 -- closing is best effort: the worker exits anyway
            pass


def report(segment: Segment, worker: int, i: int, text: str) -> None:
    """Leave env i's failure message in worker's control block, keeping
    the message of the oldest failure still standing (the parent reports
    the first failed env of a call)."""
    previous, _ = segment.message(worker)
    if previous < 0 or previous == i or segment.arrays["status"][previous] == 0 or previous > i:
        segment.write_message(worker, i, text)


def serve(env_slice: Any, spin: int, notify_fd: int = -1) -> None:
    """A worker's loop: wait for requests (spin ns, then sleep on the futex,
    GIL released), run them, publish; until the parent sets exit.
    notify_fd: the daemon pool's eventfd, written after the acks when the
    parent asked for it (ENVD_JOB_NOTIFY; -1: never asked)."""
    ctl = env_slice.segment.ctl(env_slice.worker)
    seen = 0
    while True:
        seq = lib.envd_worker_wait(ctl, seen, spin)
        if seq == seen:
            return
        seen = seq
        # (taken before the requests are run: one posted later wakes us again)
        notify = notify_fd >= 0 and lib.envd_worker_take_notify(ctl)
        env_slice.run_pending()
        lib.envd_worker_done(ctl)
        if notify:
            os.eventfd_write(notify_fd, 1)
