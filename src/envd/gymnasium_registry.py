"""envd's envs in gymnasium's registry, under the namespace ``envd/``.

    import envd, gymnasium
    env = gymnasium.make_vec("envd/CartPole-v1", num_envs=1024, seed=0)   # envd.make(...)
    env = gymnasium.make_vec("envd/CartPole-v1", num_envs=1024, seed=0,
                             endpoint="default")          # envd.connect().make(...)
    env = gymnasium.make("envd/CartPole-v1")               # one env, a gymnasium.Env

How: gymnasium 1.x has no plugin entry points any more (``load_plugin_envs``
and the ``gymnasium.envs`` group were removed in 1.0), so ``import envd``
registers the built-in ids here (``register_env_ids``), and
``envd.load_plugin`` registers a plugin's ids when it loads them.  Each id
gets a ``vector_entry_point`` (``make_vector_env``: make_vec returns envd's
own VecEnv, not a SyncVectorEnv of single envs) and an ``entry_point``
(``make_env``: a single env, ``envd.single_env.EnvdEnv``).  Time limits are
envd's own (registered ``max_episode_steps=None``: gymnasium adds no
TimeLimit); make_vec's ``max_episode_steps=`` goes to envd.

Copies by default: make_vec takes gymnasium's own ``copy: bool = True`` (the
name and default of SyncVectorEnv/AsyncVectorEnv), so code written for
gymnasium's vector envs may keep what step returns (an off-policy loop's ``obs
= next_obs`` then ``buffer.add(obs, ...)``).  ``copy=False`` returns envd's
views of its buffers, as envd.make and Client.make do by default (DESIGN
section 4), for loops that consume each step before the next.

PufferLib's Ocean envs are registered as ``envd/puffer:<env>`` for every env
envd has a manifest for, built or not: making one loads the user's build
(``envd ocean build``; an UnknownEnvError naming that command when there is
none), or with ``endpoint=`` asks a daemon started with ``--ocean``.  gymnasium
reads the colon as "import this module first"; envd's lookup (below) takes an
envd id with a colon as it is.

gymnasium's own ids are untouched.  gymnasium resolves ``"module:id"`` by
importing module and then looking id up, so ``"envd:CartPole-v1"`` would be
gymnasium's CartPole; envd wraps gymnasium's lookup (``_find_spec``) so that an
id with the module prefix ``envd:`` and no namespace means ``envd/<id>``:
``"envd:CartPole-v1"`` is envd's CartPole, and ``"envd:Nope-v0"`` fails with
gymnasium's error that ``Nope`` does not exist in namespace envd.  Nothing else goes
through the wrapper differently.  One case cannot be routed: when envd is not
imported yet, gymnasium imports it in the middle of its lookup and then looks
up the bare id, which is gymnasium's own; ``import envd`` notices that it is
imported by that lookup and raises a gymnasium error saying to write
``envd/<id>`` (or to call again, envd being imported by then), instead of
letting gymnasium's env through silently.
"""
from __future__ import annotations

import functools
import importlib.util
import sys
from collections.abc import Iterable
from pathlib import Path
from types import FrameType
from typing import Any

import gymnasium
from gymnasium.envs import registration as _gym_registration

from envd import _native_facts
from envd.make_options import PUFFER_PREFIX
from envd.single_env import EnvdEnv
from envd.vector_make import make_vector_env  # noqa: F401 -- the registered vector_entry_point

#: The namespace of envd's ids in gymnasium's registry.
NAMESPACE = "envd"
#: The ids of envd's built-in envs, registered at ``import envd`` without
#: loading the native core (a trainer that only talks to a daemon never loads
#: it): generated from builtin_envs.h's list at build time;
#: tests/ecosystem/test_gymnasium.py checks them against envd.list_envs().
BUILTIN_ENV_IDS = tuple(sorted(_native_facts.BUILTIN_ENV_IDS))
#: The spec kwarg naming the envd id (gymnasium passes spec kwargs to the entry points).
_ID_KWARG = "envd_id"


def make_env(*, envd_id: str, endpoint: Any = None, **kwargs: Any) -> gymnasium.Env:
    """gymnasium.make's entry point: one env (envd.single_env.EnvdEnv) over a
    vector env of one, in-process or daemon-served as make_vector_env."""
    return EnvdEnv.make(envd_id, endpoint=endpoint, **kwargs)


def gymnasium_id(env_id: str) -> str:
    """envd's id as registered in gymnasium: ``envd/<env_id>``."""
    return f"{NAMESPACE}/{env_id}"


def _gymnasium_reward_threshold(env_id: str) -> float | None:
    """gymnasium's own reward_threshold for an id it registers too (envd's
    ports of its envs: CartPole-v1's 475.0 ...), read from its registry; None
    for the others."""
    spec = _gym_registration.registry.get(env_id)
    return None if spec is None else spec.reward_threshold


def register_env_ids(env_ids: Iterable[str]) -> list[str]:
    """Register ``envd/<id>`` for each id (idempotent) and return the gymnasium
    ids registered.  envd.load_plugin calls it for a plugin's ids; call it
    yourself for an env only a daemon knows (one it loaded with --plugin).
    Ids gymnasium cannot parse (its ``name-vN`` grammar) are skipped: make
    them with envd.make / Client.make."""
    registered = []
    for env_id in env_ids:
        full_id = gymnasium_id(env_id)
        try:
            _gym_registration.parse_env_id(full_id)
        except gymnasium.error.Error:
            continue
        if full_id not in _gym_registration.registry:
            gymnasium.register(id=full_id, entry_point=f"{__name__}:make_env",
                               vector_entry_point=f"{__name__}:make_vector_env",
                               max_episode_steps=None, kwargs={_ID_KWARG: env_id},
                               reward_threshold=_gymnasium_reward_threshold(env_id))
        registered.append(full_id)
    return registered


def ocean_env_ids() -> list[str]:
    """The ``puffer:<env>`` ids of the Ocean envs envd has a manifest for
    (``envd ocean build`` builds them), read from the installed manifests'
    names without importing envd.native (no native core is loaded)."""
    spec = importlib.util.find_spec("envd.native")
    if spec is None or not spec.submodule_search_locations:
        return []
    folder = Path(next(iter(spec.submodule_search_locations))) / "ocean" / "manifests"
    return sorted(f"{PUFFER_PREFIX}{p.stem}" for p in folder.glob("*.h"))


def _colon_spec(env_id: str) -> Any:
    """The spec of an envd id holding a colon ("envd/puffer:go"), which
    gymnasium's _find_spec would split into a module to import and an id."""
    spec = _gym_registration.registry.get(env_id)
    if spec is None:
        raise gymnasium.error.Error(
            f"No registered env with id: {env_id}. envd's Ocean ids are "
            f"{', '.join(gymnasium_id(i) for i in ocean_env_ids()) or 'none'}; a daemon's "
            f"plugin ids need envd.gymnasium_registry.register_env_ids first")
    return spec


def _envd_prefix_means_namespace(find_spec):
    """Wrap gymnasium's _find_spec: "envd:<id>" without a namespace -> "envd:envd/<id>";
    an envd id with a colon ("envd/puffer:go", "envd:puffer:go") is looked up
    as it is (gymnasium would import "envd/puffer" as a module)."""
    @functools.wraps(find_spec)
    def find_spec_envd(env_id, *args, **kwargs):
        if isinstance(env_id, str) and env_id.startswith(NAMESPACE + ":") \
                and "/" not in env_id[len(NAMESPACE) + 1:]:
            rest = env_id[len(NAMESPACE) + 1:]
            env_id = gymnasium_id(rest) if ":" in rest else f"{NAMESPACE}:{gymnasium_id(rest)}"
        if isinstance(env_id, str) and env_id.startswith(NAMESPACE + "/") and ":" in env_id:
            return _colon_spec(env_id)
        return find_spec(env_id, *args, **kwargs)
    find_spec_envd.envd_wrapped = True
    return find_spec_envd


def _unrouted_lookup(find_spec) -> str | None:
    """The bare id of a gymnasium lookup "envd:<id>" that is importing envd
    right now (the unwrapped find_spec, called before envd was imported), or None."""
    code = getattr(find_spec, "__code__", None)
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code is code:
            name = frame.f_locals.get("env_name")
            if frame.f_locals.get("module") == NAMESPACE and isinstance(name, str) \
                    and "/" not in name:
                return name
            return None
        frame = frame.f_back
    return None


def install() -> None:
    """What ``import envd`` does: register the built-ins and the Ocean ids
    (``envd/puffer:<env>``: made, as any make, from the user's build or a
    daemon's --ocean), and route "envd:<id>" to envd's ids.  Idempotent.
    Raises gymnasium.error.Error when envd is imported by a lookup of
    "envd:<id>" that cannot be routed (see the module docstring)."""
    register_env_ids(BUILTIN_ENV_IDS)
    register_env_ids(ocean_env_ids())
    find_spec = getattr(_gym_registration, "_find_spec", None)
    if find_spec is None or getattr(find_spec, "envd_wrapped", False):
        return
    _gym_registration._find_spec = _envd_prefix_means_namespace(find_spec)
    name = _unrouted_lookup(find_spec)
    if name is not None:
        raise gymnasium.error.Error(
            f"'envd:{name}' would give gymnasium's own {name!r}: gymnasium imported envd "
            f"after choosing what to look up. Write 'envd/{name}' (after `import envd`), "
            f"or call again: envd is imported now and 'envd:{name}' means 'envd/{name}'")
