"""PufferLib's own Ocean code, built and loaded for tests: the reference.

``reference_binding(env)`` compiles PufferLib's unmodified ``binding.c`` with
the real Python.h, numpy and PufferLib's own ``env_binding.h`` into a Python
extension (PufferLib's flags, raylib linked as its setup.py links it), in a
per-user temporary cache (envd.native.ocean_reference, which `envd bench
--ocean` shares).  ``puffer_class(env)`` loads the env's own Python
class from the same tree with that binding (``pufferlib/pufferlib.py`` and
``spaces.py`` loaded as they are; PufferLib's ``__init__`` is not run: it
symlinks into the working directory and imports torch, and ``gym``, which
spaces.py names, is gymnasium here).  ``reference_trajectory`` steps ONE env
as envd's env i is specified: ``vec_init(..., 1, s, **ckwargs)``,
``vec_reset(h, s)``, then ``vec_step``.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import types
from pathlib import Path

import gymnasium
import numpy as np

from envd.native import ocean_build, ocean_reference, ocean_source

_CACHE = Path(tempfile.gettempdir()) / f"envd-ocean-tests-{os.getuid()}"


def test_cache() -> Path:
    """The tests' private Ocean cache (0700): builds and the fetched sdist."""
    return ocean_build.check_private_dir(_CACHE, create=True)


def source_tree() -> Path:
    """PufferLib's tree: $ENVD_OCEAN_SOURCE (a tree or the sdist), else the
    pinned sdist from the package index (fetched once into the test cache)."""
    return ocean_source.resolve(None, test_cache())


def reference_binding(env: str, extra_flags: tuple[str, ...] = ()) -> types.ModuleType:
    """PufferLib's own binding of ``env`` as a loaded extension module."""
    path = ocean_reference.build(env, source_tree(), test_cache(), extra_flags)
    return ocean_reference.load(path)


def _load(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def puffer_class(env: str, class_name: str, binding: object | None = None) -> type:
    """PufferLib's own class of ``env`` (e.g. "Breakout"), over its reference
    binding (or ``binding``, e.g. a recorder wrapping it)."""
    tree = source_tree()
    ocean = ocean_source.ocean_dir(tree)
    if "gym" not in sys.modules:
        gym = types.ModuleType("gym")
        gym.spaces = gymnasium.spaces
        sys.modules["gym"] = gym
    package = sys.modules.get("pufferlib")
    if package is None:
        package = types.ModuleType("pufferlib")
        package.__path__ = [str(ocean.parent)]
        sys.modules["pufferlib"] = package
        package.spaces = _load("pufferlib.spaces", ocean.parent / "spaces.py")
        core = _load("pufferlib.pufferlib", ocean.parent / "pufferlib.py")
        for key, value in vars(core).items():
            if not key.startswith("__"):
                setattr(package, key, value)
        ocean_pkg = types.ModuleType("pufferlib.ocean")
        ocean_pkg.__path__ = [str(ocean)]
        sys.modules["pufferlib.ocean"] = ocean_pkg
    env_pkg = types.ModuleType(f"pufferlib.ocean.{env}")
    env_pkg.__path__ = [str(ocean / env)]
    env_pkg.binding = reference_binding(env) if binding is None else binding
    sys.modules[f"pufferlib.ocean.{env}"] = env_pkg
    sys.modules[f"pufferlib.ocean.{env}.binding"] = env_pkg.binding
    module = _load(f"pufferlib.ocean.{env}.{env}", ocean / env / f"{env}.py")
    return getattr(module, class_name)


def reference_trajectory(binding: types.ModuleType, ckwargs: dict, seed: int, actions: np.ndarray,
                         agents: int, obs_shape: tuple, obs_dtype, act_dtype,
                         after_step=None) -> dict:
    """One env of PufferLib's binding, seeded as envd's env of that seed, fed
    ``actions`` (steps x agents x ...): the obs after reset and every step,
    rewards and terminals.  ``after_step(handle)`` runs after every step."""
    obs = np.zeros((agents, *obs_shape), dtype=obs_dtype)
    acts = np.zeros((agents, *actions.shape[2:]), dtype=act_dtype).reshape(agents, -1)
    if acts.shape[1] == 1:
        acts = acts.reshape(agents)
    rews = np.zeros(agents, dtype=np.float32)
    terms = np.zeros(agents, dtype=bool)
    truncs = np.zeros(agents, dtype=bool)
    handle = binding.vec_init(obs, acts, rews, terms, truncs, 1, seed, **ckwargs)
    try:
        binding.vec_reset(handle, seed)
        out = {"obs": [obs.copy()], "rewards": [], "terminals": []}
        for step_actions in actions:
            acts[...] = step_actions.reshape(acts.shape)
            binding.vec_step(handle)
            if after_step is not None:
                after_step(handle)
            out["obs"].append(obs.copy())
            out["rewards"].append(rews.copy())
            out["terminals"].append(terms.copy())
    finally:
        binding.vec_close(handle)
    return {k: np.stack(v) for k, v in out.items()}
