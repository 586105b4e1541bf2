"""envd.client: the trainer side -- connect to a daemon and drive its envs.

Needs only numpy, pyzmq, msgpack and gymnasium; never imports native code.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from envd.client import connection as _connection
from envd.client.connection import Client
from envd.client.discovery import is_dns_url, resolve
from envd.client.multi import MultiClient, MultiVecEnv
from envd.client.remote_vector_env import RemoteVecEnv


def connect(endpoint: str | Sequence[str] | None = None, **kwargs: Any) -> Client | MultiClient:
    """Connect to envd daemons.

    - one endpoint ("ipc:///path" or "tcp://host:port"; default:
      ENVD_ENDPOINT, else the default ipc socket): a Client, as always;
    - a list of endpoints: a MultiClient with one Client per daemon, whose
      make() spreads one VecEnv over all of them;
    - "dns+tcp://NAME:PORT": a MultiClient over every address NAME resolves
      to (e.g. a Kubernetes headless Service), each as tcp://ADDR:PORT.

    kwargs (timeout=..., server_key=..., client_key=...: see
    envd.client.connection.connect) go to every Client: each call raises
    envd.EnvdTimeoutError after timeout seconds without a reply, and
    envd.ConnectionLostError at once if a daemon goes away."""
    if endpoint is not None and not isinstance(endpoint, str):
        return MultiClient(endpoint, **kwargs)
    if endpoint is not None and is_dns_url(endpoint):
        return MultiClient(resolve(endpoint), **kwargs)
    return _connection.connect(endpoint, **kwargs)


__all__ = ["connect", "Client", "RemoteVecEnv", "MultiClient", "MultiVecEnv"]
