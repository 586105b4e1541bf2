"""The ``puffer:<env>`` ids: PufferLib's Ocean envs from the build cache.

``envd.make("puffer:go", ...)`` in a user's own process loads the go build
recorded in the user's Ocean cache (``envd ocean build`` made it) and makes
it as any plugin env.  A daemon serves Ocean envs only when its operator
starts it with ``--ocean`` (``load_for_daemon``): it loads them at startup
from the operator's cache, checked to be the operator's own (mode 0700), and
a client can only name an id, never a path.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from gymnasium.vector import AutoresetMode

from envd.errors import EnvdError, PluginError, UnknownEnvError
from envd.make_options import PUFFER_PREFIX as PREFIX
from envd.make_options import check_episode_statistics
from envd.native import ocean_build
from envd.native.registry import list_envs, load_plugin
from envd.native.vector_env import VecEnv, make_native


def ensure_loaded(env_id: str, cache: Path | None = None) -> None:
    """Load ``puffer:<env>``'s build from the cache unless it is loaded;
    UnknownEnvError saying how to build it when the cache has none."""
    if env_id in list_envs():
        return
    env = env_id[len(PREFIX):]
    try:
        builds = ocean_build.installed_builds(cache)
    except ocean_build.OceanBuildError as e:
        raise UnknownEnvError(f"{env_id}: {e}") from None
    if env not in builds:
        known = ", ".join(ocean_build.manifest_envs())
        hint = (f"build it with `envd ocean build {env}`" if env in ocean_build.manifest_envs()
                else f"envd builds the Ocean envs {known}")
        raise UnknownEnvError(f"unknown env id {env_id!r}: no build of {env!r} in the Ocean "
                              f"cache {cache or ocean_build.default_cache()}; {hint}")
    load_plugin(builds[env])


def make_puffer(env_id: str, num_envs: int, *, seed: int | Sequence[int] | None,
                num_threads: int | None, autoreset_mode: str | AutoresetMode | None,
                max_episode_steps: int | None, copy: bool, episode_statistics: bool | str,
                pin_cpus: Sequence[int] | None, batch_size: int | None,
                plugin: str | os.PathLike[str] | None, render_mode: str | None,
                **env_kwargs: Any) -> VecEnv:
    """envd.make of ``puffer:<env>`` (make_options.KINDS' builder of the
    kind): its build loaded from the user's Ocean cache (unless a plugin,
    given or loaded before, defines the id), then made as any C env."""
    check_episode_statistics(episode_statistics)  # a bad value fails before any work
    if plugin is not None:
        load_plugin(plugin)
    ensure_loaded(env_id)
    return make_native(env_id, num_envs, seed=seed, num_threads=num_threads,
                       autoreset_mode=autoreset_mode, max_episode_steps=max_episode_steps,
                       copy=copy, episode_statistics=episode_statistics, pin_cpus=pin_cpus,
                       batch_size=batch_size, plugin=None, render_mode=render_mode,
                       **env_kwargs)


def load_for_daemon(envs: Iterable[str], cache: str | os.PathLike | None) -> list[dict[str, Any]]:
    """The daemon's --ocean: load each env's build from the operator's cache
    ("all": every recorded build).  One report entry per env, as
    server/plugins.py's: {"path", "envs"} or {"path", "error"}."""
    envs = list(envs)
    root = Path(cache) if cache else None
    try:
        builds = ocean_build.installed_builds(root)
    except EnvdError as e:
        return [{"path": f"{PREFIX}{env}", "error": str(e)} for env in envs]
    if envs == ["all"]:
        envs = sorted(builds)
    report: list[dict[str, Any]] = []
    for env in envs:
        if env not in builds:
            report.append({"path": f"{PREFIX}{env}", "error": (
                f"--ocean {env}: no build in the Ocean cache "
                f"{root or ocean_build.default_cache()} (run `envd ocean build {env}`)")})
            continue
        try:
            report.append({"path": str(builds[env]), "envs": load_plugin(builds[env])})
        except PluginError as e:
            report.append({"path": str(builds[env]), "error": str(e)})
    return report
