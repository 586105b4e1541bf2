"""RLlib's env runners stepping envd's envs (new API stack; ``pip install 'envd-rl[rllib]'``).

    import ray
    from ray.rllib.algorithms.ppo import PPOConfig
    from envd.integrations.ray import start_daemons
    from envd.integrations.rllib import use_envd

    ray.init(address="auto")
    daemons = start_daemons(num_nodes=2, threads=2)
    config = use_envd(PPOConfig(), "CartPole-v1", daemons=daemons).debugging(seed=0)
    config = config.env_runners(num_env_runners=2, num_envs_per_env_runner=16)
    algo = config.build_algo()
    algo.train()

How: ``use_envd`` registers an env creator with RLlib (``tune.register_env``)
and sets ``gym_env_vectorize_mode="vector_entry_point"``, so each
``SingleAgentEnvRunner`` calls the creator once with its ``num_envs`` and
steps the VectorEnv it returns.  The creator connects to the daemon on the env
runner's own Ray node (its ipc socket: shared memory, no copy over a socket)
and makes the runner's envs there; an env runner on a node without a daemon
gets its envs spread over every daemon (tcp, CURVE keys from the DaemonSet).
Without ``daemons``, ``endpoint`` names one daemon every runner uses, and
with neither the envs are stepped in-process (``envd.make``).

Seeds: each runner's envs are made with a random base seed; with
``config.debugging(seed=s)`` RLlib's first ``reset(seed=s + k)`` of runner k
reseeds them, env i then gets ``s + k + i`` exactly as in gymnasium's own
vector envs under RLlib (so runners' streams overlap, shifted by one: RLlib's
convention, not envd's).  The creator cannot offset seeds itself: RLlib
hands it a plain dict without the runner's index.

What RLlib needs and envd provides: spaces (a gymnasium VectorEnv's
``single_observation_space``/``single_action_space``), the ``next_step``
autoreset mode that RLlib's episode bookkeeping assumes (envd's default: the
step after a done returns the new episode's first observation, which RLlib
records as that episode's reset), and arrays RLlib may keep: the envs are made
with ``copy=True`` (envd's own arrays are views that the next step
overwrites, and RLlib stores observations in its episodes).  Episode returns
and lengths RLlib counts itself, so envd's episode statistics are off.  What
it lacks: ``call``/``get_attr``/``set_attr`` on envs (RLlib's default
runners never call them; a callback that does gets gymnasium's error), and
``render``, which RLlib's env runners do not use.
"""
from __future__ import annotations

from typing import Any

import gymnasium as gym

try:
    from ray.tune.registry import register_env
except ImportError as exc:  # pragma: no cover -- depends on the installation
    raise ImportError("envd.integrations.rllib needs RLlib: pip install 'envd-rl[rllib]'") \
        from exc

import envd

__all__ = ["ENV_NAME", "make_env", "use_envd"]

#: The name use_envd registers with RLlib.
ENV_NAME = "envd"


class _ClientOwningVecEnv(gym.vector.VectorWrapper):
    """A daemon-served VectorEnv that also closes its client when closed."""

    def __init__(self, env: gym.vector.VectorEnv, client: Any):
        super().__init__(env)
        self._client = client

    def close(self, **kwargs: Any) -> None:
        try:
            super().close(**kwargs)
        finally:
            self._client.close()


def make_env(config: dict[str, Any]) -> gym.vector.VectorEnv:
    """RLlib's env creator: config is the EnvContext (env_config, worker_index,
    and num_envs added by the env runner).  Keys: ``env_id`` (required),
    ``num_envs``, ``daemons`` (a DaemonSet), ``endpoint``,
    ``make_kwargs`` (a dict for make), ``connect_kwargs`` (for envd.connect)."""
    env_id = config["env_id"]
    num_envs = int(config.get("num_envs", 1))
    kwargs = {"episode_statistics": False, **config.get("make_kwargs", {}), "copy": True}
    daemons = config.get("daemons")
    connect_kwargs = dict(config.get("connect_kwargs", {}))
    if daemons is not None:
        local = daemons.local_endpoint()
        client = (envd.connect(local, **connect_kwargs) if local is not None
                  else daemons.connect(**connect_kwargs))
    elif config.get("endpoint") is not None:
        client = envd.connect(config["endpoint"], **connect_kwargs)
    else:
        return envd.make(env_id, num_envs=num_envs, **kwargs)
    try:
        env = client.make(env_id, num_envs=num_envs, **kwargs)
    except BaseException:
        client.close()
        raise
    return _ClientOwningVecEnv(env, client)


def use_envd(config: Any, env_id: str, *, daemons: Any = None, endpoint: str | None = None,
             connect_kwargs: dict[str, Any] | None = None,
             **make_kwargs: Any) -> Any:
    """config (an RLlib AlgorithmConfig) with its env runners stepping env_id
    through envd: on the daemon of their node (daemons, a DaemonSet from
    envd.integrations.ray.start_daemons), on one daemon (endpoint), or
    in-process (neither).  make_kwargs go to every make (e.g.
    max_episode_steps).  Returns config, changed in place."""
    register_env(ENV_NAME, make_env)
    env_config = {"env_id": env_id, "daemons": daemons, "endpoint": endpoint,
                  "make_kwargs": make_kwargs, "connect_kwargs": dict(connect_kwargs or {})}
    return (config.environment(ENV_NAME, env_config=env_config)
            .env_runners(gym_env_vectorize_mode="vector_entry_point"))
