"""The in-process vector env: ``envd.make(...)``.

A ``VecEnv`` owns one native session (N env instances, their async books;
envd.native.native_session) and, unless it runs serially, one native thread
pool.  The session is its stepper (envd.stepping).  Batch buffers are numpy arrays the vec
writes into directly; ``step`` and ``reset`` return views of them (see
envd.vector_base for their lifetime and the API shared with the
daemon-served VecEnv).
"""
from __future__ import annotations

import inspect
import os
import secrets
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode

from envd import make_options as options
from envd.autoreset import mark_resets_itself
from envd.buffer_layout import buffer_layout
from envd.errors import InvalidArgumentError
from envd.int_args import check_int, is_int, seed_list
from envd.make_options import IN_PROCESS, NATIVE
from envd.native._envd_native import lib
from envd.native.batch_rows import IdChecker, row_copier
from envd.native.native_session import NativeSession
from envd.native.native_vec import MAX_NUM_ENVS, NativePool
from envd.native.registry import EnvSpec, get_spec, load_plugin
from envd.stepping import NO_STEPPER
from envd.vector_base import BatchedVecEnv

_CACHE_LINE = 64

AUTORESET_MODE_CODES = {
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


def check_episode(spec: EnvSpec, autoreset_mode: Any,
                  max_episode_steps: Any) -> tuple[AutoresetMode, int]:
    """spec's autoreset mode and time limit (0: none) from make's arguments
    (envd.make_options.check_episode); the daemon's make checks alike."""
    mode = options.check_autoreset_mode(autoreset_mode)
    steps = options.check_max_episode_steps(NATIVE, max_episode_steps)
    return options.check_episode(spec.id, spec.resets_itself, mode, steps,
                                 spec.max_episode_steps)


class VecEnv(BatchedVecEnv):
    """N instances of one env, stepped in C by a thread pool (see envd.make)."""

    def __init__(self, spec: EnvSpec, num_envs: int, *, seed: int | Sequence[int] | None,
                 num_threads: int | None, autoreset_mode: str | AutoresetMode | None,
                 max_episode_steps: int | None, copy: bool, episode_statistics: bool | str,
                 pin_cpus: Sequence[int] | None, env_kwargs: dict[str, Any],
                 batch_size: int | None = None, render_mode: str | None = None):
        self._native = self._pool = None
        num_envs = options.check_num_envs(num_envs)
        params = spec.param_values(env_kwargs, MAKE_ARGUMENTS, num_envs)
        spec = spec.described(params, num_envs)  # (ABI 5: spaces from the params)
        agents = spec.num_agents
        options.check_rows(spec.id, num_envs, agents)
        batch_size = options.check_batch_size(batch_size, num_envs)  # (envs, not rows)
        mode, max_episode_steps = check_episode(spec, autoreset_mode, max_episode_steps)
        num_threads = options.check_num_threads(num_threads, default_num_threads())
        cpus = self._check_pin_cpus(pin_cpus, num_threads)
        render_mode = spec.check_render_mode(render_mode)
        # seed=None: a random base seed, env i then gets base + i as for an int seed.
        seeds = seed_list(secrets.randbelow(2**63) if seed is None else seed, num_envs)
        # agents are rows: the VectorEnv has num_envs * agents of them (envd.h)
        super().__init__(spec.id, spec.observation_space, spec.action_space, num_envs * agents,
                         mode, max_episode_steps, copy, episode_statistics, batch_size,
                         render_mode, spec.render_fps)
        self.num_agents = agents
        self.episode_fields = spec.episode_fields
        if spec.resets_itself:
            mark_resets_itself(self)
        self.batch_size = num_envs if batch_size is None else batch_size  # envs, not rows
        self.envd_spec = spec
        self.num_threads = num_threads
        self._id_checker = IdChecker(num_envs)  # (a send's ids are per env)
        self._bind_buffers({name: _aligned_zeros(shape, dtype) for name, (shape, dtype)
                            in buffer_layout(spec.observation_space, spec.action_space,
                                             num_envs * agents, mode, spec.info_fields,
                                             num_agents=agents,
                                             episode_fields=spec.episode_fields).items()})
        # Every env owns its generator from the start, so a first reset (even a
        # masked one) draws from seed + i, as gymnasium's reset(seed=seed) does;
        # an ABI 5 env's seed callback gets seed + i before its init.
        self._buffers["reset_seeds"][:num_envs] = seeds
        try:
            if num_threads > 0:
                self._pool = NativePool(num_threads, cpus)
            self._native = NativeSession(
                spec, num_envs, autoreset_mode=AUTORESET_MODE_CODES[mode],
                max_episode_steps=max_episode_steps, params=params, buffers=self._buffers,
                pool=self._pool, seeded=True, private_rows=True)  # (numpy arrays of ours)
            # (its step bound once: step_in_place's call is the bound native call)
            self._use_stepper(self._native, self._native.bare_step(),
                              self._native.step_result)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _check_pin_cpus(pin_cpus: Sequence[int] | None, num_threads: int) -> list[int] | None:
        if pin_cpus is None:
            return None
        usable = sorted(os.sched_getaffinity(0))
        cpus = list(pin_cpus) if isinstance(pin_cpus, (list, tuple, np.ndarray)) else None
        if (cpus is None or len(cpus) != num_threads
                or not all(is_int(c) and c in usable for c in cpus)):
            raise InvalidArgumentError(
                f"pin_cpus needs one CPU per worker thread (num_threads={num_threads}), "
                f"each one this process may use: {usable}; got {pin_cpus!r}")
        return [int(c) for c in cpus]

    # ---- BatchedVecEnv hooks --------------------------------------------------------
    def _render_frames(self) -> np.ndarray:
        # one frame per env, not per row: a multi-agent env draws all its agents once
        shape, native = self.envd_spec.render_shape, self._native
        assert shape is not None and native is not None  # render() checked render_mode, closed
        frames = np.empty((self.num_env_instances, *shape), np.uint8)
        native.render(frames)
        return frames

    def _checked_ids(self, ids: np.ndarray) -> np.ndarray:
        # one native call; the numpy check raises the error of ids refused
        checked = self._id_checker.check(ids)
        return checked if checked is not None else super()._checked_ids(ids)

    def _row_copier(self, pairs: list[tuple[np.ndarray, np.ndarray]]) -> Any:
        return row_copier(pairs) or super()._row_copier(pairs)

    def _release(self) -> None:
        if self._native is not None:
            self._native.close()
            self._native, self._stepper = None, NO_STEPPER
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __repr__(self) -> str:
        return (f"envd.VecEnv({self.env_id!r}, num_envs={self.num_envs}, "
                f"num_threads={self.num_threads}, "
                f"autoreset_mode={self.metadata['autoreset_mode']})")

    # ---- envd extras -------------------------------------------------------------------
    def dispatch_stats(self) -> dict[str, float]:
        """How steps were dispatched: measured cost per env step (ns), inline and
        pooled step counts, the last chunk size, and a blocking step's wall
        time per env as run inline and as pooled (ns; 0 until measured: the
        choice between them, docs/architecture.md)."""
        self._acquire()
        try:
            assert self._native is not None  # _acquire() refuses a closed env
            return self._native.stats()
        finally:
            self._claim.append(True)

    def set_chunk_size(self, chunk: int | None) -> None:
        """Force every step onto the pool with this chunk size (tests, benchmarks);
        None returns to adaptive dispatch."""
        if chunk is not None:
            check_int("chunk", chunk, 1, MAX_NUM_ENVS)
        self._acquire()
        try:
            assert self._native is not None  # _acquire() refuses a closed env
            self._native.set_chunk(chunk or 0)
        finally:
            self._claim.append(True)


def make(env_id: str | Callable[[], Any], num_envs: int, *,
         seed: int | Sequence[int] | None = None,
         num_threads: int | None = None, autoreset_mode: str | AutoresetMode | None = None,
         max_episode_steps: int | None = None, copy: bool = False,
         episode_statistics: bool | str = True, pin_cpus: Sequence[int] | None = None,
         batch_size: int | None = None, plugin: str | os.PathLike[str] | None = None,
         render_mode: str | None = None, num_workers: int | None = None,
         **env_kwargs: Any) -> BatchedVecEnv:
    """Create num_envs instances of env_id stepped in this process.

    env_id "pz:<module>:<factory>" hosts a PettingZoo ParallelEnv, its agents
    as rows (envd.native.hosted_pettingzoo.make_pettingzoo; a creator callable
    of one goes to envd.make_pettingzoo).

    env_id "py:<gymnasium id>" or a callable returning a gymnasium.Env hosts a
    Python env instead (envd.native.hosted_env.make_python, docs/python-envs.md):
    num_workers worker processes step it (0: the caller, like SyncVectorEnv;
    None: picked from a measured step cost; info_bytes=, the size of each
    env's info slot, is passed on; render_mode="rgb_array" renders in the
    workers); num_threads, pin_cpus and plugin are for built-in envs.

    seed:  env i is seeded with seed + i at the first reset (or pass a list of
           num_envs seeds); None draws a random base seed.
    num_threads: worker threads (0 = serial on the calling thread, None = one
           per usable CPU minus one; the caller also runs chunks).  Small batches
           run inline whatever this is, when waking a thread would cost more.
    autoreset_mode: "next_step" (None: the default), "same_step" or "disabled", as
           gymnasium.  An env that resets itself (ABI 5, e.g. PufferLib's Ocean
           envs) takes neither this nor max_episode_steps: its metadata says
           "autoreset_mode" SAME_STEP and "envd_autoreset" "the env resets itself".
    max_episode_steps: time limit (default: the env's registered limit).
    copy:  return copies instead of views of the internal buffers.
    episode_statistics: report finished episodes in the shape of gymnasium's
           RecordEpisodeStatistics (``info[key]["r"|"l"|"t"]``, mask ``info["_" + key]``):
           True puts them under key "envd_episode", so that the wrapper itself
           (which writes info["episode"]) works on top; a str names the key
           ("episode" for code that reads gymnasium's key without the
           wrapper); False reports none.
    pin_cpus: pin worker thread i to CPU pin_cpus[i] (one CPU per worker).
    batch_size: envs per recv() in async mode (async_reset/send/recv,
           EnvPool's names); default num_envs.
    plugin: load this plugin library first (envd.load_plugin), for an env id
           it defines.
    render_mode: None, or "rgb_array" for an env that renders: then render()
           returns one (height, width, 3) uint8 frame per env, drawn in C.
    env_kwargs: the env's parameters (see envd.native.get_spec(env_id).params).
    """
    kind = options.env_kind(env_id)
    given = {"seed": seed, "num_threads": num_threads, "autoreset_mode": autoreset_mode,
             "max_episode_steps": max_episode_steps, "copy": copy,
             "episode_statistics": episode_statistics, "pin_cpus": pin_cpus,
             "batch_size": batch_size, "plugin": plugin, "render_mode": render_mode,
             "num_workers": num_workers}
    # where this kind is not made, and what it does not take, refused once
    # (envd.make_options)
    about = env_id if isinstance(env_id, str) else ""
    kind.refuse_place(IN_PROCESS, about)
    options.refuse_unsupported(kind.name, IN_PROCESS, given, about)
    env: BatchedVecEnv = options.load(kind.builder)(
        env_id, num_envs, **options.taken(kind.name, IN_PROCESS, given), **env_kwargs)
    return env


def make_native(env_id: str, num_envs: int, *, seed: int | Sequence[int] | None,
                num_threads: int | None, autoreset_mode: str | AutoresetMode | None,
                max_episode_steps: int | None, copy: bool, episode_statistics: bool | str,
                pin_cpus: Sequence[int] | None, batch_size: int | None,
                plugin: str | os.PathLike[str] | None, render_mode: str | None,
                **env_kwargs: Any) -> VecEnv:
    """envd.make of a C env (built in, a plugin's, or a "puffer:<env>" build,
    which envd.native.ocean_ids.make_puffer loads first): make_options.KINDS'
    builder of the kind."""
    options.check_episode_statistics(episode_statistics)  # a bad value fails before any work
    if plugin is not None:
        load_plugin(plugin)
    spec = get_spec(env_id)
    return VecEnv(spec, num_envs, seed=seed, num_threads=num_threads,
                  autoreset_mode=autoreset_mode, max_episode_steps=max_episode_steps,
                  copy=copy, episode_statistics=episode_statistics, pin_cpus=pin_cpus,
                  env_kwargs=env_kwargs, batch_size=batch_size, render_mode=render_mode)


#: make's own keyword arguments: a mistyped one (sed=0) lands among the env
#: kwargs, whose error then suggests the argument it resembles.
MAKE_ARGUMENTS = tuple(name for name, p in inspect.signature(make).parameters.items()
                       if p.kind is inspect.Parameter.KEYWORD_ONLY)
