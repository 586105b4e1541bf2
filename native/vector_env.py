"""The in-process vector env: ``envd.make(...)``.

A ``VecEnv`` owns one native vec (N env instances) and, unless it runs
serially, one native thread pool.  Batch buffers are numpy arrays the vec
writes into directly; ``step`` and ``reset`` return views of them.

Lifetime of returned arrays: the observation, reward, termination and
truncation arrays returned by ``reset``/``step`` are views that stay valid
until the next call that steps or resets this env, which overwrites them in
place.  Keep a copy (or pass ``copy=True`` to ``make``) to hold on to them.
"""
from __future__ import annotations

import os
import secrets
import threading
from typing import Any, Sequence

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from envd.errors import (EnvStateError, InvalidActionError, InvalidArgumentError,
                         NativeError)
from envd.native._envd_native import ffi, lib
from envd.native.registry import EnvSpec, get_spec

#: The largest num_envs one VecEnv accepts (1,048,576).
MAX_NUM_ENVS = int(lib.ENVD_VEC_MAX_ENVS)
MAX_THREADS = int(lib.ENVD_POOL_MAX_THREADS)
_SEED_LIMIT = 2**64
_CACHE_LINE = 64

_AUTORESET_MODES = {
    AutoresetMode.NEXT_STEP: lib.ENVD_AUTORESET_NEXT_STEP,
    AutoresetMode.SAME_STEP: lib.ENVD_AUTORESET_SAME_STEP,
    AutoresetMode.DISABLED: lib.ENVD_AUTORESET_DISABLED,
}


def default_num_threads() -> int:
    """Worker threads for num_threads=None: one per usable CPU but one, because
    the calling thread runs chunks too while it waits for a step."""
    return max(0, len(os.sched_getaffinity(0)) - 1)


def _aligned_zeros(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Zeroed array whose data starts on a cache line (no false sharing with
    neighbouring allocations when worker threads write it)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.zeros(nbytes + _CACHE_LINE, np.uint8)
    offset = (-raw.ctypes.data) % _CACHE_LINE
    return raw[offset:offset + nbytes].view(dtype).reshape(shape)


def _ptr(array: np.ndarray, ctype: str = "void *"):
    return ffi.cast(ctype, array.ctypes.data)


AUTORESET_MODE_NAMES = {"next_step": AutoresetMode.NEXT_STEP,
                        "same_step": AutoresetMode.SAME_STEP,
                        "disabled": AutoresetMode.DISABLED}


def _parse_autoreset_mode(mode: str | AutoresetMode) -> AutoresetMode:
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


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _check_int(name: str, value: Any, low: int, high: int) -> int:
    if not _is_int(value):
        raise InvalidArgumentError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if not low <= value <= high:
        raise InvalidArgumentError(f"{name}={value} is out of range; expected {low} <= {name} <= {high}")
    return int(value)


class VecEnv(VectorEnv):
    """N instances of one env, stepped in C by a thread pool (see envd.make)."""

    def __init__(self, spec: EnvSpec, num_envs: int, *, seed: int | Sequence[int] | None,
                 num_threads: int | None, autoreset_mode: str | AutoresetMode,
                 max_episode_steps: int | None, copy: bool, episode_statistics: bool,
                 pin_cpus: Sequence[int] | None, env_kwargs: dict[str, Any]):
        self._vec = ffi.NULL
        self._pool = ffi.NULL
        self.closed = False
        # The native vec takes one call at a time; a second Python thread gets
        # a clear error instead of corrupting a step in flight.
        self._lock = threading.Lock()
        self.envd_spec = spec
        self.num_envs = _check_int("num_envs", num_envs, 1, MAX_NUM_ENVS)
        mode = _parse_autoreset_mode(autoreset_mode)
        if max_episode_steps is None:
            max_episode_steps = spec.max_episode_steps or 0
        else:  # 0: no time limit
            max_episode_steps = _check_int("max_episode_steps", max_episode_steps, 0, 2**62)
        if num_threads is None:
            num_threads = default_num_threads()
        num_threads = _check_int("num_threads", num_threads, 0, MAX_THREADS)
        cpus = self._check_pin_cpus(pin_cpus, num_threads)
        params = spec.param_values(env_kwargs)
        # seed=None: a random base seed, env i then gets base + i as for an int seed.
        seeds = self._seed_list(secrets.randbelow(2**63) if seed is None else seed)
        self._copy = bool(copy)
        self._episode_statistics = bool(episode_statistics)

        self.metadata = {"autoreset_mode": mode}
        self.render_mode = None
        self.single_observation_space = spec.observation_space
        self.single_action_space = spec.action_space
        self.observation_space = batch_space(spec.observation_space, self.num_envs)
        self.action_space = batch_space(spec.action_space, self.num_envs)
        self.max_episode_steps = max_episode_steps or None
        self.num_threads = num_threads
        self._allocate_buffers()
        self._create_native(params, _AUTORESET_MODES[mode], max_episode_steps, num_threads, cpus)
        # Every env owns its generator from the start, so a first reset (even a
        # masked one) draws from seed + i, as gymnasium's reset(seed=seed) does.
        lib.envd_vec_seed(self._vec, _ptr(seeds, "uint64_t *"))

    # ---- construction ----------------------------------------------------------
    def _allocate_buffers(self) -> None:
        n = self.num_envs
        obs_space, act_space = self.single_observation_space, self.single_action_space
        self._obs = _aligned_zeros((n, *obs_space.shape), obs_space.dtype)
        self._final_obs = (_aligned_zeros((n, *obs_space.shape), obs_space.dtype)
                           if self.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP else None)
        self._actions = _aligned_zeros((n, *act_space.shape), act_space.dtype)
        self._rewards = _aligned_zeros((n,), np.float32)
        self._terminations = _aligned_zeros((n,), np.bool_)
        self._truncations = _aligned_zeros((n,), np.bool_)
        self._episode_returns = _aligned_zeros((n,), np.float64)
        self._episode_lengths = _aligned_zeros((n,), np.int64)
        self._episode_times = _aligned_zeros((n,), np.float64)
        self._dones = _aligned_zeros((n,), np.bool_)
        # the fast path of step() compares against these
        self._action_dtype, self._action_shape = self._actions.dtype, self._actions.shape

    @staticmethod
    def _check_pin_cpus(pin_cpus: Sequence[int] | None, num_threads: int) -> list[int] | None:
        if pin_cpus is None:
            return None
        usable = sorted(os.sched_getaffinity(0))
        cpus = list(pin_cpus) if isinstance(pin_cpus, (list, tuple, np.ndarray)) else None
        if (cpus is None or len(cpus) != num_threads
                or not all(_is_int(c) and c in usable for c in cpus)):
            raise InvalidArgumentError(
                f"pin_cpus needs one CPU per worker thread (num_threads={num_threads}), "
                f"each one this process may use: {usable}; got {pin_cpus!r}")
        return [int(c) for c in cpus]

    def _create_native(self, params: list[float], mode: int, max_steps: int, threads: int,
                       cpus: list[int] | None) -> None:
        self._params = ffi.new("double[]", params or [0.0])
        self._buffers = ffi.new("envd_vec_buffers_t *", {
            "observations": _ptr(self._obs), "actions": _ptr(self._actions),
            "rewards": _ptr(self._rewards, "float *"),
            "terminations": _ptr(self._terminations, "bool *"),
            "truncations": _ptr(self._truncations, "bool *"),
            "final_observations": ffi.NULL if self._final_obs is None else _ptr(self._final_obs),
            "episode_returns": _ptr(self._episode_returns, "double *"),
            "episode_lengths": _ptr(self._episode_lengths, "int64_t *"),
            "episode_times": _ptr(self._episode_times, "double *"),
            "dones": _ptr(self._dones, "bool *"),
        })
        config = ffi.new("envd_vec_config_t *", {
            "num_envs": self.num_envs, "autoreset_mode": mode,
            "max_episode_steps": max_steps, "params": self._params})
        if threads > 0:
            out = ffi.new("envd_pool_t **")
            c_cpus = ffi.NULL if cpus is None else ffi.new("int[]", cpus)
            self._check(lib.envd_pool_create(out, threads, c_cpus), "creating the thread pool")
            self._pool = out[0]
        out = ffi.new("envd_vec_t **")
        rc = lib.envd_vec_create(out, self.envd_spec.definition, config, self._buffers, self._pool)
        if rc != lib.ENVD_OK:
            self._free_native()
            self._check(rc, f"creating {self.num_envs} {self.envd_spec.id} envs")
        self._vec = out[0]

    # ---- helpers ----------------------------------------------------------------
    def _check(self, rc: int, what: str) -> None:
        if rc != lib.ENVD_OK:
            reason = ffi.string(lib.envd_strerror(rc)).decode()
            raise NativeError(f"{self.envd_spec.id}: {what} failed: {reason} ({rc})", rc)

    def _seed_list(self, seed: int | Sequence[int]) -> np.ndarray:
        """Per-env seeds: env i gets seed + i, or the i-th of an explicit list."""
        if _is_int(seed):
            seed = int(seed)
            if not 0 <= seed <= _SEED_LIMIT - self.num_envs:
                raise InvalidArgumentError(
                    f"seed must be a non-negative int with seed + num_envs <= 2**64, got {seed}")
            return np.arange(self.num_envs, dtype=np.uint64) + np.uint64(seed)
        if isinstance(seed, (list, tuple)) or (isinstance(seed, np.ndarray) and seed.ndim == 1):
            if len(seed) != self.num_envs:
                raise InvalidArgumentError(
                    f"a list of seeds needs num_envs={self.num_envs} entries, got {len(seed)}")
            if not all(_is_int(s) and 0 <= int(s) < _SEED_LIMIT for s in seed):
                raise InvalidArgumentError("every seed in the list must be an int in [0, 2**64)")
            return np.array([int(s) for s in seed], dtype=np.uint64)
        raise InvalidArgumentError(
            f"seed must be None, an int or a list of num_envs ints, got {type(seed).__name__}")

    def _convert_actions(self, actions: Any) -> None:
        """Check actions against the action space and copy them into the native
        buffer.  Same-kind casts only: integers for discrete actions, floats
        that numpy casts safely for boxes; Python floats/lists are accepted."""
        buf = self._actions
        space = self.single_action_space
        from_python = not isinstance(actions, np.ndarray)
        array = np.asarray(actions)
        if array.shape != buf.shape:
            raise InvalidActionError(
                f"{self.envd_spec.id}: actions must have shape {buf.shape} "
                f"(num_envs={self.num_envs} x action shape {space.shape}), got {array.shape}")
        if buf.dtype.kind in "iu":
            allowed = array.dtype.kind in "biu"
            if allowed and array.size and array.dtype.kind == "u" and array.max() > np.iinfo(buf.dtype).max:
                raise InvalidActionError(
                    f"{self.envd_spec.id}: action {array.max()} is out of range; "
                    f"{space} accepts {space.start}..{space.start + space.n - 1}")
        else:
            allowed = np.can_cast(array.dtype, buf.dtype, "safe") or (
                from_python and array.dtype.kind in "fiu")
        if not allowed:
            raise InvalidActionError(
                f"{self.envd_spec.id}: actions must have dtype {buf.dtype} "
                f"(or one that casts to it without loss), got {array.dtype}; "
                f"convert with actions.astype(np.{buf.dtype})")
        np.copyto(buf, array, casting="unsafe")

    def _raise_step_error(self, rc: int) -> None:
        index = int(lib.envd_vec_error_index(self._vec))
        env_id = self.envd_spec.id
        if rc == lib.ENVD_ERANGE:
            space = self.single_action_space
            raise InvalidActionError(
                f"{env_id}: action {int(self._actions[index])} of env {index} is out of range; "
                f"{space} accepts {space.start}..{space.start + space.n - 1}")
        if rc == lib.ENVD_ESTATE and not self._dones[index]:
            raise EnvStateError(f"{env_id}: env {index} was never reset; call reset() before step()")
        if rc == lib.ENVD_ESTATE:
            raise EnvStateError(
                f"{env_id}: env {index} is done and autoreset_mode is 'disabled'; reset it with "
                f"reset(options={{'reset_mask': mask}}) before stepping it again")
        if rc == lib.ENVD_EENV:
            raise NativeError(f"{env_id}: env {index} failed in its step or reset callback", rc)
        self._check(rc, "step")

    def _acquire(self) -> None:
        """Take the env for one call, or raise if it is closed or in use."""
        if not self._lock.acquire(False):  # positional: the hot path
            raise EnvStateError(
                f"this {self.envd_spec.id} VecEnv is being used by another thread; "
                "a VecEnv takes one call at a time")
        if self.closed:
            self._lock.release()
            raise EnvStateError(f"this {self.envd_spec.id} VecEnv is closed")

    def _done_info(self) -> dict[str, Any]:
        """The info of a step in which some episode ended: gymnasium's
        RecordEpisodeStatistics shape, info["episode"]["r"|"l"|"t"] with the mask
        info["_episode"] (the native vec fills these), and for SAME_STEP
        info["final_obs"] (an object array) and info["final_info"].  Like the
        other results, the arrays are views valid until the next step (copies
        with copy=True); final_obs holds copies."""
        dones = self._dones.copy() if self._copy else self._dones
        info: dict[str, Any] = {}
        if self._final_obs is not None:
            final = np.full(self.num_envs, None, dtype=object)
            done_index = np.flatnonzero(dones)
            for i, obs in zip(done_index, self._final_obs[done_index]):
                final[i] = obs
            info["final_obs"], info["_final_obs"] = final, dones
            info["final_info"], info["_final_info"] = {}, dones
        if self._episode_statistics:
            stats = (self._episode_returns, self._episode_lengths, self._episode_times)
            if self._copy:
                stats = tuple(a.copy() for a in stats)
            info["episode"] = dict(zip("rlt", stats))
            info["_episode"] = dones
        return info

    # ---- gymnasium API -------------------------------------------------------------
    def reset(self, *, seed: int | Sequence[int] | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset every env (or those in options["reset_mask"]); seed as in make."""
        if options is not None and not isinstance(options, dict):
            raise InvalidArgumentError(f"options must be a dict or None, got {type(options).__name__}")
        options = dict(options or {})
        mask = options.pop("reset_mask", None)
        if options:
            raise InvalidArgumentError(
                f"{self.envd_spec.id}: unsupported reset options {sorted(options)}; "
                "the only option is 'reset_mask'")
        if mask is not None:
            if not (isinstance(mask, np.ndarray) and mask.dtype == np.bool_
                    and mask.shape == (self.num_envs,) and mask.any()):
                raise InvalidArgumentError(
                    f"options['reset_mask'] must be a bool numpy array of shape "
                    f"({self.num_envs},) with at least one True value")
            mask = np.ascontiguousarray(mask)
        seeds = self._seed_list(seed) if seed is not None else None
        self._acquire()
        try:
            rc = lib.envd_vec_reset(self._vec,
                                    ffi.NULL if seeds is None else _ptr(seeds, "uint64_t *"),
                                    ffi.NULL if mask is None else _ptr(mask, "bool *"))
        finally:
            self._lock.release()
        self._check(rc, "reset")
        return (self._obs.copy() if self._copy else self._obs), {}

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        """Step every env; returns (obs, rewards, terminations, truncations, info)."""
        # The hot path: keep it to a few attribute lookups and one native call.
        self._acquire()
        try:
            if (actions.__class__ is np.ndarray and actions.dtype == self._action_dtype
                    and actions.shape == self._action_shape):
                self._actions[...] = actions
            else:
                self._convert_actions(actions)
            num_done = lib.envd_vec_step(self._vec)
            if num_done < 0:
                self._raise_step_error(num_done)
            info = self._done_info() if num_done else {}
        finally:
            self._lock.release()
        if self._copy:
            return (self._obs.copy(), self._rewards.copy(), self._terminations.copy(),
                    self._truncations.copy(), info)
        return self._obs, self._rewards, self._terminations, self._truncations, info

    def close(self, **kwargs: Any) -> None:
        """Free the envs and the thread pool.  Idempotent; waits for a call in
        progress on another thread."""
        lock = getattr(self, "_lock", None)
        if lock is None:  # __init__ failed before creating anything native
            return
        with lock:
            self._free_native()

    def _free_native(self) -> None:
        if self._vec != ffi.NULL:
            lib.envd_vec_destroy(self._vec)
            self._vec = ffi.NULL
        if self._pool != ffi.NULL:
            lib.envd_pool_destroy(self._pool)
            self._pool = ffi.NULL
        self.closed = True

    def __del__(self) -> None:
        self.close()

    def __enter__(self) -> "VecEnv":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"envd.VecEnv({self.envd_spec.id!r}, num_envs={self.num_envs}, "
                f"num_threads={self.num_threads}, "
                f"autoreset_mode={self.metadata['autoreset_mode']})")

    # ---- envd extras -------------------------------------------------------------------
    def dispatch_stats(self) -> dict[str, float]:
        """How steps were dispatched: measured cost per env step (ns), inline and
        pooled step counts, and the last chunk size."""
        stats = ffi.new("envd_vec_stats_t *")
        self._acquire()
        try:
            lib.envd_vec_get_stats(self._vec, stats)
        finally:
            self._lock.release()
        return {"cost_ns_per_env": stats.cost_ns_per_env, "inline_jobs": stats.inline_jobs,
                "pooled_jobs": stats.pooled_jobs, "last_chunk": stats.last_chunk}

    def set_chunk_size(self, chunk: int | None) -> None:
        """Force every step onto the pool with this chunk size (tests, benchmarks);
        None returns to adaptive dispatch."""
        if chunk is not None:
            _check_int("chunk", chunk, 1, MAX_NUM_ENVS)
        self._acquire()
        try:
            lib.envd_vec_set_chunk(self._vec, chunk or 0)
        finally:
            self._lock.release()


def make(env_id: str, num_envs: int, *, seed: int | Sequence[int] | None = None,
         num_threads: int | None = None, autoreset_mode: str | AutoresetMode = "next_step",
         max_episode_steps: int | None = None, copy: bool = False,
         episode_statistics: bool = True, pin_cpus: Sequence[int] | None = None,
         **env_kwargs: Any) -> VecEnv:
    """Create num_envs instances of env_id stepped in this process.

    seed:  env i is seeded with seed + i at the first reset (or pass a list of
           num_envs seeds); None draws a random base seed.
    num_threads: worker threads (0 = serial on the calling thread, None = one
           per usable CPU minus one; the caller also runs chunks).  Small batches
           run inline whatever this is, when waking a thread would cost more.
    autoreset_mode: "next_step" (default), "same_step" or "disabled", as gymnasium.
    max_episode_steps: time limit (default: the env's registered limit).
    copy:  return copies instead of views of the internal buffers.
    episode_statistics: report finished episodes in info["episode"] as
           gymnasium's RecordEpisodeStatistics does; pass False to wrap the env
           in that wrapper yourself (it refuses an info that has the key).
    pin_cpus: pin worker thread i to CPU pin_cpus[i] (one CPU per worker).
    env_kwargs: the env's parameters (see envd.native.get_spec(env_id).params).
    """
    spec = get_spec(env_id)
    return VecEnv(spec, num_envs, seed=seed, num_threads=num_threads,
                  autoreset_mode=autoreset_mode, max_episode_steps=max_episode_steps,
                  copy=copy, episode_statistics=episode_statistics, pin_cpus=pin_cpus,
                  env_kwargs=env_kwargs)
