"""What the in-process and the daemon-served VecEnv share: the gymnasium API.

Both are N envs stepped over one set of batch buffers (numpy arrays in the
process, or views of a session's shared memory); they differ only in who runs
a reset or a step: the native core in this process, or the daemon.  Keeping
argument checks, action conversion, the info dict and the view/copy rules
here makes the two behave the same by construction.

Lifetime of returned arrays: the observation, reward, termination and
truncation arrays returned by ``reset``/``step`` (and the arrays in ``info``)
are views that stay valid until the next call that steps or resets this env,
which overwrites them in place.  Keep a copy (or pass ``copy=True`` to
``make``) to hold on to them.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TypeGuard

import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from envd import info_codec, leaves
from envd.errors import (
    NATIVE_CODES,
    EnvdError,
    EnvStateError,
    InvalidActionError,
    InvalidArgumentError,
    NativeError,
    native_strerror,
)
from envd.stepping import NO_STEPPER, Stepper

SEED_LIMIT = 2**64

AUTORESET_MODE_NAMES = {"next_step": AutoresetMode.NEXT_STEP,
                        "same_step": AutoresetMode.SAME_STEP,
                        "disabled": AutoresetMode.DISABLED}


def parse_autoreset_mode(mode: str | AutoresetMode) -> AutoresetMode:
    """"next_step" | "same_step" | "disabled", or a gymnasium AutoresetMode
    (or its value, e.g. "NextStep")."""
    if isinstance(mode, AutoresetMode):
        return mode
    if isinstance(mode, str) and mode in AUTORESET_MODE_NAMES:
        return AUTORESET_MODE_NAMES[mode]
    if isinstance(mode, str) and mode in {m.value for m in AutoresetMode}:
        return AutoresetMode(mode)
    names = ", ".join(map(repr, AUTORESET_MODE_NAMES))
    raise InvalidArgumentError(f"unknown autoreset_mode {mode!r}; valid modes: {names}")


#: metadata["envd_autoreset"] of an env that resets itself (ABI 5
#: ENVD_ENV_RESETS_ITSELF); its metadata["autoreset_mode"] is SAME_STEP, the
#: gymnasium mode it is like (the observation after an episode's last step
#: is the next episode's first), without final_obs.
RESETS_ITSELF = "the env resets itself"


def mark_resets_itself(env: Any) -> None:
    """The metadata of a VecEnv of an env that resets itself."""
    env.metadata["autoreset_mode"] = AutoresetMode.SAME_STEP
    env.metadata["envd_autoreset"] = RESETS_ITSELF


def autoreset_mode_name(mode: AutoresetMode) -> str:
    return next(name for name, value in AUTORESET_MODE_NAMES.items() if value is mode)


def is_int(value: Any) -> TypeGuard[int | np.integer[Any]]:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_int(name: str, value: Any, low: int, high: int) -> int:
    if not is_int(value):
        raise InvalidArgumentError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if not low <= value <= high:
        raise InvalidArgumentError(f"{name}={value} is out of range; expected {low} <= {name} <= {high}")
    return int(value)


def seed_list(seed: int | Sequence[int] | np.ndarray, num_envs: int) -> np.ndarray:
    """Per-env seeds: env i gets seed + i, or the i-th of an explicit list."""
    if is_int(seed):
        seed = int(seed)
        if not 0 <= seed <= SEED_LIMIT - num_envs:
            raise InvalidArgumentError(
                f"seed must be a non-negative int with seed + num_envs <= 2**64, got {seed}")
        return np.arange(num_envs, dtype=np.uint64) + np.uint64(seed)
    if isinstance(seed, (list, tuple)) or (isinstance(seed, np.ndarray) and seed.ndim == 1):
        if len(seed) != num_envs:
            raise InvalidArgumentError(
                f"a list of seeds needs num_envs={num_envs} entries, got {len(seed)}")
        if not all(is_int(s) and 0 <= int(s) < SEED_LIMIT for s in seed):
            raise InvalidArgumentError("every seed in the list must be an int in [0, 2**64)")
        return np.array([int(s) for s in seed], dtype=np.uint64)
    raise InvalidArgumentError(
        f"seed must be None, an int or a list of num_envs ints, got {type(seed).__name__}")


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


def action_out_of_range(env_id: str, space: spaces.Discrete, action: int,
                        index: int) -> InvalidActionError:
    """The error of a discrete action outside its space (one message for the
    in-process env and the client, which checks before it posts a send)."""
    return InvalidActionError(
        f"{env_id}: action {action} of env {index} is out of range; "
        f"{space} accepts {space.start}..{space.start + space.n - 1}")


# NATIVE_CODES (envd.errors; generated from envd.h's table, so the client,
# which never loads native code, has them) maps the fast path's statuses too.


def step_error(env_id: str, action_space: spaces.Space, code: int, index: int,
               buffers: dict[str, np.ndarray], *, never_reset: bool | None = None) -> EnvdError:
    """The error of a step the native vec refused (code, a negative envd.h
    code, naming row index of buffers: an env's first row, or the row of its
    refused action), with the in-process env's message wherever it ran:
    in-process, in the daemon, or through the fast path.

    never_reset: for ESTATE, whether the env was never reset (else it is done
    with autoreset disabled), from the native session's own books; None reads
    it from the row's flags (a client's own buffers: the daemon, whose flags
    live in client-writable shared memory, always passes it).  A MultiVecEnv
    renumbers a shard's row into its own (client/multi.py _naming)."""
    if code == NATIVE_CODES["ERANGE"] and isinstance(action_space, spaces.Discrete):
        return action_out_of_range(env_id, action_space, int(buffers["actions"][index]), index)
    if code == NATIVE_CODES["ERANGE"]:
        return InvalidActionError(leaves.action_range_message(
            env_id, action_space, buffers["actions"][index], index))
    # (a refused env is done, or never reset: its flags tell which; a
    # multi-agent env's row, not its dones, which flag only the step an agent
    # ended in: a dead row repeats its final flags)
    if code == NATIVE_CODES["ESTATE"] and never_reset is None:
        never_reset = not (buffers["terminations"][index] or buffers["truncations"][index])
    if code == NATIVE_CODES["ESTATE"] and never_reset:
        return EnvStateError(f"{env_id}: env {index} was never reset; call reset() before step()")
    if code == NATIVE_CODES["ESTATE"]:
        return EnvStateError(
            f"{env_id}: env {index} is done and autoreset_mode is 'disabled'; reset it with "
            f"reset(options={{'reset_mask': mask}}) before stepping it again")
    if code == NATIVE_CODES["EBUSY"]:
        return EnvStateError(f"{env_id}: a step is already in progress on these envs")
    if code == NATIVE_CODES["EENV"]:
        return NativeError(f"{env_id}: env {index} failed in its reset, step or write_info "
                           "callback", code)
    return NativeError(f"{env_id}: step failed: {native_strerror(code)}", code)


def send_error(env_id: str, action_space: spaces.Space, num_envs: int, code: int, index: int,
               buffers: dict[str, np.ndarray], *, never_reset: bool | None = None) -> EnvdError:
    """The error of a send (an async batch) the native vec refused: as
    step_error, plus the env-id checks of the batch (one message in-process
    and through the fast path)."""
    if code == NATIVE_CODES["EBUSY"] and 0 <= index < num_envs:
        return EnvStateError(f"{env_id}: env {index} is already in flight (or twice in this "
                             "send); recv it before sending it again")
    if code == NATIVE_CODES["EINVAL"] and index >= 0:
        return InvalidArgumentError(f"{env_id}: env id {index} is out of range [0, {num_envs})")
    if code == NATIVE_CODES["EINVAL"]:
        return InvalidArgumentError(f"{env_id}: a send takes 1 to {num_envs} env ids")
    return step_error(env_id, action_space, code, index, buffers, never_reset=never_reset)


def in_flight_error(env_id: str, call: str, num_in_flight: int) -> EnvStateError:
    """The refusal of reset(), step() or render() while envs sent are in flight
    (render: or ready, not received yet; see NativeSession.render)."""
    if call == "render":
        return EnvStateError(f"{env_id}: render() while envs are in flight or not received yet "
                             "(send/async_reset); recv() them first (or reset() once none is in "
                             "flight)")
    return EnvStateError(f"{env_id}: {call}() while {num_in_flight} envs are in flight "
                         "(send/recv); recv them first")


def ready_error(env_id: str, num_ready: int) -> EnvStateError:
    """The refusal of step() while envs wait for recv."""
    return EnvStateError(
        f"{env_id}: step() while {num_ready} envs wait for recv "
        "(after async_reset or send); use recv/send, or reset() to go back to step()")


def not_idle_error(env_id: str, index: int, in_flight: bool) -> EnvStateError:
    """The refusal of a send naming an env that is in flight or ready."""
    where = "in flight" if in_flight else "ready"
    return EnvStateError(
        f"{env_id}: env {index} is {where}, not received yet; send an env "
        "only after recv returned it (or async_reset)")


def recv_short_error(env_id: str, count: int, pending: int) -> EnvStateError:
    """The refusal of a recv of count envs when only pending are in flight or ready."""
    return EnvStateError(
        f"{env_id}: recv returns {count} envs but only {pending} are in flight or ready; "
        "send more first (or async_reset)")


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


def buffer_layout(observation_space: spaces.Space, action_space: spaces.Space, num_envs: int,
                  mode: AutoresetMode, info_fields: Sequence[Any] = (),
                  reward_dtype: Any = np.float32, info_bytes: int = 0, num_agents: int = 1,
                  episode_fields: Sequence[str] = (),
                  info_columns: Sequence[tuple[str, str, tuple[int, ...]]] = ()
                  ) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """name -> (shape, dtype) of every batch buffer of a vec, in a fixed order.
    The native vec reads "actions", "reset_seeds" and "reset_mask" and writes
    the rest; "final_observations" exists in SAME_STEP mode only; info_fields
    (objects with name, shape and dtype, as EnvSpec.info_fields) add one
    buffer each.  Observations have one buffer per leaf of their space and
    actions one row per env (envd.leaves); hosted envs have float64 rewards
    (as gymnasium's vector envs) and, with info_bytes > 0, info slots of
    that many bytes per env, and info_columns ((key, dtype str, shape of
    a value)) a column each (INFO_COLUMN_PREFIX + key) and the flags INFO_IN_COLUMNS.
    A multi-agent env (num_agents > 1) has num_envs
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
    if num_agents > 1:
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


class _InfoMerger:
    """gymnasium's VectorEnv._add_info (its arrays and masks, nested dicts
    alike) for results of `rows` rows: gymnasium sizes them by num_envs,
    which an async recv's batch is not."""

    def __init__(self, rows: int):
        self.num_envs = rows

    # (gymnasium's method, borrowed: it reads only self.num_envs, which its
    # self type, a VectorEnv, does not say)
    _add_info: ClassVar[Callable[[Any, dict[str, Any], dict[str, Any], int], dict[str, Any]]] = (
        VectorEnv._add_info)


class _GatherPlan:
    """One of recv's two sets of batch buffers (slots: name -> array, plus
    "env_id") and the copies that fill it, one pair per buffer set it may
    read from (BatchedVecEnv._gather_sources): copiers[source] is
    (copy_always(rows, run), copy_on_done(rows, run)) (see _row_copier), the
    second for a batch in which an episode ended (the buffers named in
    on_done_names).  obs: the observation over the slots when it is one
    array, as returned; None for a composite space, whose dict or tuple is
    built per recv (a caller may replace its entries: a cached one would
    hand those back two recvs later)."""

    def __init__(self, slots: dict[str, np.ndarray], on_done_names: frozenset[str], obs: Any,
                 copiers: list[tuple[Any, Any]]):
        self.slots, self.on_done_names, self.obs = slots, on_done_names, obs
        self.dones = slots["dones"]
        self.copiers = copiers


def run_of(rows: np.ndarray, positions: np.ndarray) -> slice | None:
    """rows (int64) as a slice when they are consecutive and increasing (every
    batch of EnvPool's loop: a batch's envs are sent and finish together),
    else None.  positions: 0, 1, 2, ... (int64), at least as many as the
    buffers' rows.  A memcmp against positions, not np.diff: a recv's hot path."""
    count = len(rows)
    if count == 0:
        return None
    first = int(rows[0])
    if first < 0 or rows.dtype != positions.dtype:
        return None
    if rows.tobytes() != positions[first:first + count].tobytes():
        return None
    return slice(first, first + count)


class RepeatCheck:
    """Whether ids (int64, each in [0, size)) name one twice, in O(len(ids))
    (np.unique sorts or hashes: about 100 ns an id): stamp each id's
    position; a repeated id keeps only its last one.  For a send's ids and a
    daemon's recv answer (whose ids the client acts on)."""

    def __init__(self, size: int):
        self._stamp = np.zeros(size, np.int64)
        #: 0, 1, 2, ... (run_of's positions too)
        self.positions = np.arange(size, dtype=np.int64)

    def repeats(self, ids: np.ndarray) -> bool:
        if len(ids) > len(self._stamp):
            return True  # (more ids than there are, all in range)
        if run_of(ids, self.positions) is not None:
            return False  # (a sorted run: a memcmp, EnvPool's every batch)
        positions = self.positions[:len(ids)]
        self._stamp[ids] = positions
        # (ids are in range: "clip" skips numpy's buffered bounds check)
        return bool((self._stamp.take(ids, mode="clip") != positions).any())


class _LastBatch:
    """The last recv's batch (of a single-agent env), so that a send of
    exactly those envs (EnvPool's loop: send(actions, info["env_id"])) skips
    the id checks (a recv's ids are in range and each once: the stepper's
    books say so in-process, and the client refuses a daemon's answer that
    does not, SocketStepper._check_answer_ids) and writes its actions as a
    slice when they were a run: about 8 us of a cheap env's batch.  A bytes
    compare tells whether a send's ids are that batch, whoever holds the
    array (the caller may have changed it in place)."""

    def __init__(self, env_id: np.ndarray, rows: slice | None):
        self._ids = env_id.tobytes()
        self._dtype = env_id.dtype
        #: the batch's rows as a slice (run_of), or None
        self.rows = rows

    def sends(self, env_ids: Any) -> bool:
        """env_ids (a send's) are this batch's ids, in its order."""
        return (env_ids.__class__ is np.ndarray and env_ids.dtype == self._dtype
                and env_ids.ndim == 1 and env_ids.tobytes() == self._ids)


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


def possible_agents(names: Sequence[str], num_agents: int) -> list[str]:
    """names when there is one per agent, else PettingZoo's (and mpe2's)
    default names agent_0, agent_1, ..."""
    if len(names) == num_agents:
        return list(names)
    return [f"agent_{i}" for i in range(num_agents)]


class BatchedVecEnv(VectorEnv):
    """A gymnasium VectorEnv over batch buffers, stepped through a Stepper.

    Subclasses bind the buffers (``_bind_buffers``, arrays as in
    buffer_layout), set ``self._stepper`` (envd.stepping.Stepper: it runs the
    envs and keeps the async books) and implement ``_render_frames()`` and
    ``_release()`` (free everything; idempotent).  This class keeps no async
    books: it checks what needs no state, writes the inputs, calls the
    stepper and gathers the outputs and infos.
    """

    def __init__(self, env_id: str, observation_space: spaces.Space, action_space: spaces.Space,
                 num_envs: int, mode: AutoresetMode, max_episode_steps: int | None,
                 copy: bool, episode_statistics: bool | str, batch_size: int | None = None,
                 render_mode: str | None = None, render_fps: int | None = None):
        self.closed = False
        #: the info key of envd's episode statistics, None when they are off
        #: (see episode_statistics_key); checked first so a bad value fails early
        self.episode_statistics_key = episode_statistics_key(episode_statistics)
        # One call at a time; a second Python thread gets a clear error instead
        # of corrupting a step in flight.
        self._lock = threading.Lock()
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
        self._repeat_check = RepeatCheck(num_envs)  # (_checked_ids)
        self._positions = self._repeat_check.positions  # 0, 1, 2, ... (run_of)
        #: the last recv's batch, for the send of those envs (see _LastBatch)
        self._last_batch: _LastBatch | None = None
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
        self._plans: list[_GatherPlan] | None = None  # recv's, over these buffers (built lazily)
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
        """Take the env for one call, or raise if it is closed or in use."""
        if not self._lock.acquire(False):  # positional: the hot path
            raise EnvStateError(
                f"this {self.env_id} VecEnv is being used by another thread; "
                "a VecEnv takes one call at a time")
        if self.closed:
            self._lock.release()
            raise EnvStateError(f"this {self.env_id} VecEnv is closed")

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
        merger = _InfoMerger(len(lengths))
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
            self._lock.release()
        return (leaves.copy_value(self._obs) if self._copy else self._obs), info

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        """Step every env; returns (obs, rewards, terminations, truncations, info)."""
        # The hot path: keep it to a few attribute lookups and one call
        # (_acquire's tests inline: a method call is a visible share of it).
        lock = self._lock
        if not lock.acquire(False):
            self._acquire()  # (raises: in use by another thread)
        elif self.closed:
            lock.release()
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
                self._last_num_done = num_done = self._stepper.step()
            except BaseException:  # (envs may have stepped: step_info describes no step)
                self._last_num_done = None
                raise
            info = self._done_info() if num_done else {}
            if self._more_info:
                self._add_more_info(info)
        finally:
            lock.release()
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
        lock = self._lock
        if not lock.acquire(False):
            self._acquire()  # (raises: in use by another thread)
        elif self.closed:
            lock.release()
            self._acquire()  # (raises: closed)
        try:
            if self._maybe_running:
                self._check_buffers_free()
            try:
                self._last_num_done = num_done = self._stepper.step()
            except BaseException:  # (envs may have stepped: step_info describes no step)
                self._last_num_done = None
                raise
        finally:
            lock.release()
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
            self._lock.release()

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
            self._stepper.async_reset(seeds is not None)
            self._rewards[:] = 0  # a fresh episode has earned nothing
            self._dones[:] = False
        finally:
            self._lock.release()

    def send(self, actions: Any, env_ids: Any) -> None:
        """Start stepping the envs env_ids (each idle: received, not sent since)
        with actions (one row per env id); returns at once."""
        self._acquire()
        try:
            last = self._last_batch
            if last is not None and last.sends(env_ids):
                # the envs the last recv returned, as it returned them: in
                # range and each once (_LastBatch)
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
            self._lock.release()

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
            self._lock.release()

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
            self._last_batch = _LastBatch(env_id, run if source_rows is None else run_of(
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
                       dict(zip(self.episode_fields, _ended_columns(log, out["dones"]))))
            info.update(self._episode_info(out["dones"], final,
                                           tuple(out[name] for name in self._EPISODE_STATS),
                                           columns))
        if self._info_lengths is not None:
            self._add_env_infos(info, out, env_ids=out["env_id"])
        return obs, out["rewards"], out["terminations"], out["truncations"], info

    def _gather_plans(self) -> list[_GatherPlan]:
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
                plans.append(_GatherPlan(
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
            self._lock.release()
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
        """Free the envs.  Idempotent; waits for a call in progress on another thread."""
        lock = getattr(self, "_lock", None)
        if lock is None:  # __init__ failed before creating anything
            return
        with lock:
            self._release()
            self.closed = True
        # taken before closing them: an owned client closes this env back
        owned, self._owned = self._owned, []
        for resource in owned:
            resource.close()

    def close_along(self, resource: Any) -> None:
        """Close resource (anything with close(), e.g. the envd.Client this
        env was made through) when this env closes: for an env whose maker
        opened the connection for it (gymnasium.make_vec("envd/...",
        endpoint=...)), so that closing the env leaks nothing."""
        self._owned.append(resource)

    def __del__(self) -> None:
        self.close()

    def __enter__(self) -> BatchedVecEnv:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


#: np.where costs about 7 ns a row of the log (27 us a step for 4096 rows of
#: 4 fields), a copy of the ended rows by index about 30 ns an ended row plus
#: the search for them: _ended_columns takes the index on long logs where few
#: rows ended (measured for issue 36).
_WHERE_MAX_ROWS = 256
_INDEX_MAX_SHARE = 8  # at most 1 row in 8 ended


def _ended_columns(log: np.ndarray, dones: np.ndarray) -> np.ndarray:
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
