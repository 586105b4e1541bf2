"""envd.native: the C core (pool, vec, RNG, built-in envs, plugins) and the in-process VecEnv."""
from envd.native.native_vec import MAX_NUM_ENVS
from envd.native.registry import EnvSpec, get_spec, list_envs, load_plugin
from envd.native.vector_env import VecEnv, make

__all__ = ["make", "list_envs", "get_spec", "load_plugin", "EnvSpec", "VecEnv", "MAX_NUM_ENVS"]
