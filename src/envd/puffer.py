"""A backend for PufferLib's ``pufferlib.vector.make``: Ocean envs stepped by envd.

A PufferLib user switches one line::

    vecenv = pufferlib.vector.make(Breakout, env_kwargs=dict(num_envs=1024),
                                   backend=envd.puffer.Backend)        # was Multiprocessing

``creator`` may be PufferLib's own Ocean class (``pufferlib.ocean.<env>.<env>.<Class>``,
as ``pufferlib.ocean.environment.env_creator`` returns it: recognised by its
module and never called, so PufferLib's binding is never built or imported)
or envd's own ``envd.puffer.creator("go", **kwargs)``.  Either way the envs
are envd's ``puffer:<env>`` build (``envd ocean build``), stepped in this
process (``envd.make``) or by a daemon (``envd.puffer.backend(endpoint=...)``,
a daemon started with ``--ocean``).

The counts are PufferLib's: an Ocean class's ``num_envs`` kwarg is the envs of
one instance and ``vector.make``'s ``num_envs`` the instances, so envd makes
their product; ``num_agents`` counts rows (a multi-agent env's agents).
``vector.make`` passes no seed: ``async_reset(seed)`` seeds (envd's
``reset(seed=s)``: env i gets ``srand(s + i)`` then its ``c_reset``), and the
envs are made with seed 0, as PufferLib's own backends make them.

The interface is PufferLib's async one: ``send(actions)`` starts envd stepping
the batch the last recv returned and returns at once (envd's async send),
``recv()`` waits for the next batch (all envs, or with ``batch_size`` below
``num_envs`` contiguous batches in turn) and returns PufferLib's tuple:
``(obs, rewards, terminals, truncations, infos, env_ids, masks)``, with
``teacher_actions`` after ``truncations`` where the installed
pufferlib-core's ``vector.reset`` unpacks eight values (3.0.19 and later).
Rewards are float32 and rows are in agent order, as PufferLib's buffers.

Infos: PufferLib's Ocean classes return, every ``log_interval`` steps, a list
holding their ``Log`` averaged over the episodes that ended since the last one
(plus ``n``, the episodes counted; ``{}`` when none ended), and an empty list
between reports.  Here the same cadence
(the class's ``log_interval`` kwarg or its default; 128 for envd's creator)
averages envd's ``info["envd_log"]`` (the env's Log fields of each episode that
ended, per row) over the rows and steps since the last report; ``n`` counts
those row entries.
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from envd.errors import InvalidArgumentError

#: Logged every this many steps when the creator gives no log_interval.
DEFAULT_LOG_INTERVAL = 128
#: PufferLib's Ocean class kwargs that are PufferLib's own, not the env's:
#: the backend reads them and envd's make never sees them.
_PUFFER_ONLY_KWARGS = ("num_envs", "log_interval", "render_mode", "buf")
#: vector.make's kwargs for its own backends: accepted and meaningless here
#: (envd's pool replaces the workers; its threads come from num_threads).
_PUFFER_VEC_KWARGS = ("num_workers", "zero_copy", "sync_traj", "overwork")


class OceanCreator:
    """envd's creator of ``puffer:<env>`` for ``pufferlib.vector.make``.

    ``kwargs`` are the env's make kwargs (envd's manifest: PufferLib's class
    kwargs), plus PufferLib's ``num_envs`` (envs per instance, default 1) and
    ``log_interval``.  Calling it makes the envs in this process
    (``envd.make``), for use outside PufferLib."""

    def __init__(self, env: str, **kwargs: Any) -> None:
        if not isinstance(env, str) or not env or ":" in env:
            raise InvalidArgumentError(f"envd.puffer.creator: an Ocean env name such as "
                                       f"'breakout', got {env!r}")
        self.env = env
        self.kwargs = kwargs

    @property
    def env_id(self) -> str:
        """envd's id of the env: ``puffer:<env>``."""
        return f"puffer:{self.env}"

    def __call__(self, **kwargs: Any) -> Any:
        import envd.native
        merged = {**self.kwargs, **kwargs}
        num_envs = merged.pop("num_envs", 1)
        merged.pop("log_interval", None)
        return envd.native.make(self.env_id, num_envs, **merged)

    def __repr__(self) -> str:
        return f"envd.puffer.creator({self.env!r}, **{self.kwargs!r})"


def creator(env: str, **kwargs: Any) -> OceanCreator:
    """envd's creator of the Ocean env ``env`` (e.g. ``"go"``) with make
    kwargs ``kwargs``, for ``pufferlib.vector.make(creator, backend=Backend)``."""
    return OceanCreator(env, **kwargs)


def _ocean_class_env(obj: Any) -> str | None:
    """The env of PufferLib's own Ocean class (module
    ``pufferlib.ocean.<env>.<env>``), or None.  Recognised, never called."""
    module = getattr(obj, "__module__", "") or ""
    parts = module.split(".")
    if inspect.isclass(obj) and len(parts) == 4 and parts[:2] == ["pufferlib", "ocean"] \
            and parts[2] == parts[3]:
        return parts[2]
    return None


def _resolve(env_creators: Sequence[Any], env_args: Sequence[Any],
             env_kwargs: Sequence[dict]) -> tuple[str, dict, int, int]:
    """(envd id, make kwargs, envs per instance, log interval) of vector.make's
    creators, which must all be one creator with one set of kwargs."""
    first, args, kwargs = env_creators[0], env_args[0], env_kwargs[0]
    for other, other_args, other_kwargs in zip(env_creators, env_args, env_kwargs):
        if other is not first or list(other_args) != list(args) or other_kwargs != kwargs:
            raise InvalidArgumentError("envd's PufferLib backend steps one env kind: give "
                                       "vector.make one creator and one env_kwargs")
    if args:
        raise InvalidArgumentError("envd's PufferLib backend takes env_kwargs, not env_args "
                                   f"(got {len(args)} positional args)")
    env: str | None
    if isinstance(first, OceanCreator):
        env, merged, interval = first.env, {**first.kwargs, **kwargs}, DEFAULT_LOG_INTERVAL
    else:
        env = _ocean_class_env(first)
        if env is None:
            raise InvalidArgumentError(
                f"envd's PufferLib backend takes envd.puffer.creator(...) or one of "
                f"PufferLib's Ocean classes (pufferlib.ocean.<env>.<env>.<Class>), got "
                f"{first!r}")
        merged = dict(kwargs)
        default = inspect.signature(first).parameters.get("log_interval")
        interval = DEFAULT_LOG_INTERVAL if default is None or default.default is \
            inspect.Parameter.empty else default.default
    if merged.get("render_mode") is not None:
        raise InvalidArgumentError("envd's PufferLib backend does not render (render_mode="
                                   f"{merged['render_mode']!r}): render with PufferLib's own class")
    if merged.get("buf") is not None:
        raise InvalidArgumentError("envd's PufferLib backend owns its buffers: buf is not "
                                   "accepted")
    if "seed" in merged:
        raise InvalidArgumentError("envd's PufferLib backend is seeded by async_reset(seed), "
                                   "not by a seed env kwarg")
    per_instance = merged.get("num_envs", 1)
    interval = merged.get("log_interval", interval)
    for name, value in (("num_envs", per_instance), ("log_interval", interval)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise InvalidArgumentError(f"envd's PufferLib backend: {name} must be a positive "
                                       f"int, got {value!r}")
    make_kwargs = {k: v for k, v in merged.items() if k not in _PUFFER_ONLY_KWARGS}
    return f"puffer:{env}", make_kwargs, int(per_instance), int(interval)


def _recv_has_teacher_actions() -> bool:
    """Whether the installed pufferlib's recv tuple carries teacher_actions
    (pufferlib-core 3.0.19 on: its ``vector.reset`` unpacks eight values)."""
    try:
        from pufferlib import vector
    except Exception:  # noqa: BLE001 -- no pufferlib (or one that fails to import): 3.0.0's tuple
        return False
    names = getattr(getattr(vector, "reset", None), "__code__", None)
    return names is not None and any("teacher" in n for n in names.co_varnames)


class _Block:
    """One batch of the backend: an envd vec of batch_size instances' envs,
    its float32 rewards, and its own Log books (its envs step once per recv
    of this block, as one PufferLib worker's)."""

    def __init__(self, env: Any, first_row: int) -> None:
        self.env = env
        self.rows = slice(first_row, first_row + env.num_envs)
        # each row's env, in row order: what send names (envd's per-row ids)
        self.row_envs = np.repeat(np.arange(env.num_env_instances), env.num_agents)
        self.rewards = np.zeros(env.num_envs, dtype=np.float32)
        self.ticks = 0
        self.log_sums: dict[str, float] = {}
        self.log_count = 0


class Backend:
    """``pufferlib.vector.make(creator, backend=Backend, ...)``: the envs of
    ``creator`` stepped by envd.  ``backend(endpoint=..., num_threads=...)``
    gives one that steps through a daemon or with a given number of threads.

    ``batch_size`` (instances per recv, dividing ``num_envs``; default all):
    below ``num_envs`` the instances form contiguous batches, each its own envd
    vec, received in turn (batch 0, 1, ..., as PufferLib's Multiprocessing
    with ``sync_traj``): while the trainer computes on one, the others step."""

    def __init__(self, env_creators: Sequence[Callable], env_args: Sequence[Any],
                 env_kwargs: Sequence[dict], num_envs: int, *, endpoint: Any = None,
                 num_threads: int | None = None, batch_size: int | None = None,
                 recv_tuple: int | None = None, **vec_kwargs: Any) -> None:
        unknown = sorted(set(vec_kwargs) - set(_PUFFER_VEC_KWARGS))
        if unknown:
            raise InvalidArgumentError(f"envd's PufferLib backend: unknown argument(s) "
                                       f"{', '.join(unknown)}")
        batch_size = num_envs if batch_size is None else batch_size
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
                or batch_size < 1 or num_envs % batch_size:
            raise InvalidArgumentError(
                f"envd's PufferLib backend: batch_size must divide num_envs ({num_envs}), "
                f"got {batch_size!r}")
        if recv_tuple not in (None, 7, 8):
            raise InvalidArgumentError(f"recv_tuple must be 7, 8 or None, got {recv_tuple!r}")
        env_id, make_kwargs, per_instance, self.log_interval = _resolve(
            env_creators, env_args, env_kwargs)
        if endpoint is not None and num_threads is not None:
            raise InvalidArgumentError("num_threads is the daemon's (envd --threads) when the "
                                       "backend has an endpoint")
        from envd.vector_make import open_endpoint
        self._client, self._owned = open_endpoint(endpoint)
        block_envs = int(batch_size) * per_instance
        self._blocks: list[_Block] = []
        try:
            for k in range(int(num_envs) // int(batch_size)):
                # env j of the whole backend is made with seed j, as one make seeded 0
                first = self._blocks[-1].rows.stop if self._blocks else 0
                self._blocks.append(_Block(self._make(env_id, block_envs, k * block_envs,
                                                      num_threads, make_kwargs), first))
        except BaseException:
            self.close()
            raise
        env = self._blocks[0].env
        self.env_id = env_id
        self.single_observation_space = env.single_observation_space
        self.single_action_space = env.single_action_space
        self.num_agents = self._blocks[-1].rows.stop  # rows of every batch
        self.agents_per_batch = env.num_envs
        self.observation_space = env.observation_space
        self.action_space = env.action_space
        self.emulated = False
        self.agent_ids = np.arange(self.num_agents)
        self.masks = np.ones(self.agents_per_batch, dtype=bool)
        self.teacher_actions = np.zeros(env.action_space.shape, dtype=(
            env.action_space.dtype if env.action_space.dtype.kind == "f" else np.int32))
        self._teacher = (_recv_has_teacher_actions() if recv_tuple is None
                         else recv_tuple == 8)
        self._ready: list[int] = []    # blocks sent (or reset), in the order recv returns them
        self._held: int | None = None  # the block the last recv returned, not yet sent

    def _make(self, env_id: str, count: int, seed: int, num_threads: int | None,
              make_kwargs: dict) -> Any:
        if self._client is None:
            import envd.native
            return envd.native.make(env_id, count, seed=seed, num_threads=num_threads,
                                    **make_kwargs)
        return self._client.make(env_id, count, seed=seed, **make_kwargs)

    @property
    def num_envs(self) -> int:
        """Rows per batch, as PufferLib's backends count (agents)."""
        return self.agents_per_batch

    @property
    def driver_env(self) -> Backend:
        """What PufferLib's policies read spaces from (single_*_space)."""
        return self

    def async_reset(self, seed: int | None = 42) -> None:
        """Reset every env (seed: env i gets seed + i; None: no reseed); the
        next recvs return the first observations, batch by batch."""
        for block in self._blocks:
            first_env = block.rows.start // block.env.num_agents
            block.env.async_reset(seed=None if seed is None else seed + first_env)
            block.ticks = -1  # the reset's recv is no step (the class's tick is 0 after reset)
            block.log_sums, block.log_count = {}, 0
        self._ready = list(range(len(self._blocks)))
        self._held = None

    def send(self, actions: Any) -> None:
        """Start stepping the batch the last recv returned with ``actions`` (one
        row per agent of it); returns at once."""
        if self._held is None:
            raise InvalidArgumentError("send before recv: call async_reset, then recv, "
                                       "then send what it returned")
        block = self._blocks[self._held]
        actions = np.asarray(actions).reshape(block.env.action_space.shape)
        block.env.send(actions, block.row_envs)
        self._ready.append(self._held)
        self._held = None

    def recv(self) -> tuple:
        """Wait for the next batch and return PufferLib's recv tuple."""
        if self._held is not None or not self._ready:
            raise InvalidArgumentError("recv before send: call async_reset, or send the "
                                       "batch the last recv returned")
        k = self._ready.pop(0)
        block = self._blocks[k]
        obs, rewards, terminals, truncations, info = block.env.recv()
        self._held = k
        # envd returns envs in the order they finished; PufferLib's rows are
        # in agent order (a multi-agent env's agents stay together, in order)
        env_id = info["env_id"]
        if not (env_id == block.row_envs).all():
            order = np.argsort(env_id, kind="stable")
            obs, rewards = obs[order], rewards[order]
            terminals, truncations = terminals[order], truncations[order]
        block.rewards[:] = rewards
        infos = self._log(block, info)
        ids = self.agent_ids[block.rows]
        if self._teacher:
            return (obs, block.rewards, terminals, truncations, self.teacher_actions, infos,
                    ids, self.masks)
        return obs, block.rewards, terminals, truncations, infos, ids, self.masks

    def _log(self, block: _Block, info: dict) -> list[dict[str, float]]:
        """Add this step's episode Logs; every log_interval steps, PufferLib's
        info list: [their mean, with n], or [{}] when no episode ended."""
        log, mask = info.get("envd_log"), info.get("_envd_log")
        if log is not None and mask is not None and mask.any():
            for name, values in log.items():
                block.log_sums[name] = block.log_sums.get(name, 0.0) + float(values[mask].sum())
            block.log_count += int(mask.sum())
        block.ticks += 1
        if block.ticks == 0 or block.ticks % self.log_interval:
            return []
        if not block.log_count:
            return [{}]  # PufferLib's vec_log when no episode ended
        report = {name: total / block.log_count for name, total in block.log_sums.items()}
        report["n"] = float(block.log_count)
        block.log_sums, block.log_count = {}, 0
        return [report]

    def reset(self, seed: int | None = 42) -> tuple[np.ndarray, list]:
        """PufferLib's ``vector.reset``: async_reset then recv; (obs, infos)."""
        self.async_reset(seed)
        out = self.recv()
        return out[0], out[-3]

    def step(self, actions: Any) -> tuple:
        """PufferLib's ``vector.step``: send then recv; (obs, rewards, terminals,
        truncations, infos)."""
        self.send(actions)
        out = self.recv()
        return out[0], out[1], out[2], out[3], out[-3]

    def close(self) -> None:
        """Close the envs (and a connection the backend opened)."""
        try:
            for block in self._blocks:
                block.env.close()
        finally:
            if self._owned and self._client is not None:
                self._client.close()
            self._owned = False


def backend(*, endpoint: Any = None, num_threads: int | None = None) -> Callable[..., Backend]:
    """A ``backend=`` for ``pufferlib.vector.make`` (whose own kwargs cannot
    carry envd's): steps through the daemon at ``endpoint`` ("default": envd's
    default endpoint; a str or list: ``envd.connect(endpoint)``; an open
    client) or in this process with ``num_threads`` threads."""
    return functools.partial(Backend, endpoint=endpoint, num_threads=num_threads)


__all__ = ["Backend", "OceanCreator", "backend", "creator", "DEFAULT_LOG_INTERVAL"]
