"""A vector env of an envd id, in this process or served by a daemon, from
one ``endpoint`` argument: what gymnasium's entry points
(envd.gymnasium_registry), a single env (envd.single_env) and the PufferLib
backend (envd.puffer) share."""
from __future__ import annotations

from typing import Any

from gymnasium.vector import VectorEnv


def open_endpoint(endpoint: Any) -> tuple[Any, bool]:
    """(client, owned): endpoint None -> in-process (no client); "default" ->
    envd.connect() (ENVD_ENDPOINT, else the default ipc socket); a str or list
    -> envd.connect(endpoint); an object with make() (an envd.Client or
    MultiClient you opened) -> itself, not owned (you close it)."""
    if endpoint is None:
        return None, False
    if hasattr(endpoint, "make"):
        return endpoint, False
    from envd.client import connect
    return connect(None if endpoint == "default" else endpoint), True


def make_vector_env(num_envs: int = 1, *, envd_id: str, endpoint: Any = None,
                    copy: bool = True, **kwargs: Any) -> VectorEnv:
    """gymnasium.make_vec's entry point: ``envd.make(envd_id, num_envs, **kwargs)``,
    or with ``endpoint`` the daemon-served env ``connect(endpoint).make(...)``
    (see open_endpoint); a connection opened here closes with the env.  ``copy`` is
    gymnasium's (default True: results are new arrays, safe to keep, as
    SyncVectorEnv's); ``copy=False`` returns envd's views of its buffers."""
    client, owned = open_endpoint(endpoint)
    if client is None:
        import envd.native
        return envd.native.make(envd_id, num_envs, copy=copy, **kwargs)
    try:
        env = client.make(envd_id, num_envs, copy=copy, **kwargs)
    except BaseException:
        if owned:
            client.close()
        raise
    if owned:
        env.close_along(client)
    return env
