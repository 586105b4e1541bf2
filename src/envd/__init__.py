"""envd: vectorised RL environments stepped by a native thread pool, in-process or in a daemon.

    import envd
    env = envd.make("CartPole-v1", num_envs=1024, seed=0)               # in-process
    env = envd.connect().make("CartPole-v1", num_envs=1024, seed=0)     # served by `envd`
    obs, info = env.reset()
    obs, rewards, terminations, truncations, info = env.step(actions)
"""
__version__ = "0.1.0"

from typing import Any

from envd.client import Client, MultiClient, MultiVecEnv, RemoteVecEnv, connect
from envd.errors import (
    AuthenticationError,
    ConnectionLostError,
    DaemonError,
    EnvdError,
    EnvdTimeoutError,
    EnvError,
    EnvStateError,
    InvalidActionError,
    InvalidArgumentError,
    LimitExceededError,
    NativeError,
    NoDaemonError,
    PluginError,
    ProtocolError,
    SessionExpiredError,
    SharedMemoryError,
    ShuttingDownError,
    UnknownEnvError,
    UnknownSessionError,
    UntrustedPathError,
    UntrustedSegmentError,
)

#: Loaded on first use, so that a trainer that only talks to a daemon
#: (envd.connect) never loads the native core.
_NATIVE = {"make", "list_envs", "load_plugin", "VecEnv"}


def __getattr__(name: str) -> Any:
    if name in _NATIVE:
        import envd.native
        return getattr(envd.native, name)
    if name == "make_pettingzoo":
        from envd.native.hosted_pettingzoo import make_pettingzoo
        return make_pettingzoo
    if name == "native":
        import envd.native
        return envd.native
    raise AttributeError(f"module 'envd' has no attribute {name!r}")


__all__ = ["make", "make_pettingzoo", "list_envs", "load_plugin", "VecEnv", "connect", "Client", "RemoteVecEnv",
           "MultiClient", "MultiVecEnv",
           "EnvdError", "UnknownEnvError", "InvalidArgumentError", "InvalidActionError",
           "EnvStateError", "EnvError", "NativeError", "ProtocolError", "LimitExceededError",
           "UnknownSessionError", "SessionExpiredError", "DaemonError", "ShuttingDownError",
           "ConnectionLostError", "NoDaemonError", "AuthenticationError", "EnvdTimeoutError", "SharedMemoryError",
           "PluginError", "UntrustedPathError", "UntrustedSegmentError", "__version__"]

# gymnasium.make_vec("envd/<id>") and gymnasium.make("envd/<id>"): register
# envd's ids with gymnasium (no native code loaded; see envd.gymnasium_registry).
from envd import gymnasium_registry as _gymnasium_registry  # noqa: E402

_gymnasium_registry.install()
