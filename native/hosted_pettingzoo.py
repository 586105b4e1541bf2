"""The in-process maker of hosted PettingZoo envs (envd.make("pz:...") and
envd.make_pettingzoo): the hosted VecEnv of their ParallelEnvs, their agents
as rows (native/hosted_agent_slice.py), as a C multi-agent env's."""
from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from typing import Any

import cloudpickle
from gymnasium.vector import AutoresetMode

from envd import make_options as options
from envd.errors import InvalidArgumentError, UnknownEnvError
from envd.hosted_pettingzoo import PETTINGZOO_PREFIX
from envd.make_options import IN_PROCESS, PETTINGZOO
from envd.native.hosted_agent_slice import _Creator, make_from_creator, make_from_id
from envd.native.hosted_env import HostedVecEnv, make_hosted


def creator_of_id(env_id: str, env_kwargs: dict[str, Any]) -> _Creator:
    """The adapter creator of a "pz:<module>:<factory>" id (InvalidArgumentError
    for a malformed id, UnknownEnvError when its top-level module is missing)."""
    if not env_id.startswith(PETTINGZOO_PREFIX) or env_id.count(":") != 2 or \
            not all(env_id.split(":")[1:]):
        raise InvalidArgumentError(f"a PettingZoo env id is 'pz:<module>:<factory>', got "
                                   f"{env_id[:200]!r}")
    _, module, factory = env_id.split(":")
    if importlib.util.find_spec(module.split(".")[0]) is None:
        raise UnknownEnvError(f"{env_id}: no module {module!r}")
    return _Creator(make_from_id, module, factory, env_kwargs)


def make_pettingzoo(env: str | Callable[[], Any], num_envs: int, *,
                    num_workers: int | None = None, seed: int | Sequence[int] | None = None,
                    episode_statistics: bool | str = True, copy: bool = False,
                    batch_size: int | None = None, render_mode: str | None = None,
                    autoreset_mode: str | AutoresetMode | None = None,
                    info_bytes: int | None = None, **env_kwargs: Any) -> HostedVecEnv:
    """num_envs PettingZoo ParallelEnvs hosted in num_workers worker
    processes, their agents as rows (docs/python-envs.md, "PettingZoo"):
    num_envs * A rows, as a C multi-agent env's.

    env: "pz:<module>:<factory>" (module.factory(**env_kwargs) returns a
         ParallelEnv, e.g. "pz:mpe2.simple_spread_v3:parallel_env"), or a
         callable returning one (sent with cloudpickle; takes no kwargs).
    num_workers, seed, episode_statistics: as envd.make's for "py:" envs
         (seed s seeds env i with s + i: one seed per env).
    batch_size: envs per async recv (each num_agents rows), as envd.make's.
    render_mode: None or "rgb_array": a "pz:" id's factory is called with
         it, a creator's ParallelEnv must have it already; render() then
         returns each env's frame (the ParallelEnv's own render()), drawn in
         its worker.
    autoreset_mode: as envd.make's ("next_step", None, "same_step" or
         "disabled": an env is done once every agent is); info_bytes: 0
         (None), as its env infos are not carried.
    """
    mode = options.check_autoreset_mode(autoreset_mode) or AutoresetMode.NEXT_STEP
    options.check_info_bytes(PETTINGZOO, info_bytes)
    num_envs = options.check_num_envs(num_envs)
    batch_size = options.check_batch_size(batch_size, num_envs)
    options.check_episode_statistics(episode_statistics)
    num_workers = options.check_num_workers(num_workers, num_envs, IN_PROCESS)
    options.check_render_mode(render_mode)
    if isinstance(env, str):
        if render_mode is not None:
            env_kwargs = {**env_kwargs, "render_mode": render_mode}
        name, creator = env, creator_of_id(env, env_kwargs)
    elif callable(env):
        if env_kwargs:
            raise InvalidArgumentError(f"env kwargs {sorted(env_kwargs)} are for 'pz:' ids; a "
                                       "creator takes its own arguments")
        name = PETTINGZOO_PREFIX + getattr(env, "__qualname__", type(env).__name__)
        creator = _Creator(make_from_creator, cloudpickle.dumps(env))
    else:
        raise InvalidArgumentError(f"env must be a 'pz:<module>:<factory>' id or a callable "
                                   f"returning a PettingZoo ParallelEnv, got {type(env).__name__}")
    return make_hosted(("parallel", cloudpickle.dumps(creator), None, {}), name, num_envs,
                       num_workers=num_workers, seed=seed, autoreset_mode=mode,
                       max_episode_steps=None, copy=copy, episode_statistics=episode_statistics,
                       batch_size=batch_size, info_bytes=0, render_mode=render_mode)
