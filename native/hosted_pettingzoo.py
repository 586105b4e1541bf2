"""The in-process maker of hosted PettingZoo envs (envd.make("pz:...") and
envd.make_pettingzoo): the adapters of envd.hosted_pettingzoo hosted by
make_python, viewed as rows."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import cloudpickle
from gymnasium.vector import AutoresetMode

from envd import make_options as options
from envd.errors import InvalidArgumentError
from envd.hosted_pettingzoo import (
    PETTINGZOO_PREFIX,
    PettingZooVecEnv,
    _Creator,
    creator_of_id,
    make_from_creator,
    rows_view,
)
from envd.make_options import PETTINGZOO
from envd.native.hosted_env import make_python


def make_pettingzoo(env: str | Callable[[], Any], num_envs: int, *,
                    num_workers: int | None = None, seed: int | Sequence[int] | None = None,
                    episode_statistics: bool | str = True, copy: bool = False,
                    batch_size: int | None = None, render_mode: str | None = None,
                    autoreset_mode: str | AutoresetMode | None = None,
                    info_bytes: int | None = None, **env_kwargs: Any) -> PettingZooVecEnv:
    """num_envs PettingZoo ParallelEnvs hosted in num_workers worker
    processes, their agents as rows (docs/python-envs.md, "PettingZoo").

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
    autoreset_mode: "next_step" (None), the only one it takes; info_bytes: 0
         (None), as its env infos are not carried.
    """
    options.check_autoreset_mode(PETTINGZOO, autoreset_mode)
    options.check_info_bytes(PETTINGZOO, info_bytes)
    num_envs = options.check_num_envs(num_envs)
    options.check_episode_statistics(episode_statistics)
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
    inner = make_python(creator, num_envs, num_workers=num_workers, seed=seed,
                        episode_statistics=False, copy=copy, info_bytes=0, name=name,
                        batch_size=batch_size, render_mode=render_mode)
    return rows_view(inner, name, episode_statistics)
