"""envd: vectorised RL environments stepped by a native thread pool.

    import envd
    env = envd.make("CartPole-v1", num_envs=1024, seed=0)   # in-process
    obs, info = env.reset()
    obs, rewards, terminations, truncations, info = env.step(actions)
"""
from envd.errors import (EnvdError, EnvStateError, InvalidActionError, InvalidArgumentError,
                         NativeError, UnknownEnvError)
from envd.native import VecEnv, list_envs, make

__version__ = "0.1.0"

__all__ = ["make", "list_envs", "VecEnv", "EnvdError", "UnknownEnvError",
           "InvalidArgumentError", "InvalidActionError", "EnvStateError", "NativeError",
           "__version__"]
