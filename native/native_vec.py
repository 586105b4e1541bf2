"""NativePool (a native thread pool) and the cffi structs of one
``envd_vec_t`` over caller-owned buffers (vec_buffers, vec_config).

Every stepping caller goes through a native session
(envd.native.native_session.NativeSession), which owns its vec; the tests'
bare vec (tests/support/native_vec.py) builds its vec from these too.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from envd.errors import NativeError
from envd.native._envd_native import ffi, lib
from envd.native.registry import EnvSpec
from envd.vec_info import INFO_PREFIX

#: The largest num_envs one vec accepts (1,048,576).
MAX_NUM_ENVS = int(lib.ENVD_VEC_MAX_ENVS)


def ptr(array: np.ndarray, ctype: str = "void *") -> Any:
    """A cffi pointer of type ctype to array's data (cffi's cdata: Any,
    the compiled core's ffi has no type information); the caller keeps
    array alive as long as the pointer is used."""
    return ffi.cast(ctype, array.ctypes.data)


def strerror(rc: int) -> str:
    """The native core's message for an ENVD_E* code."""
    return bytes(ffi.string(lib.envd_strerror(rc))).decode()


class NativePool:
    """A native thread pool (num_threads >= 1); close() joins its workers."""

    def __init__(self, num_threads: int, cpus: list[int] | None = None):
        out = ffi.new("envd_pool_t **")
        c_cpus = ffi.NULL if cpus is None else ffi.new("int[]", cpus)
        rc = lib.envd_pool_create(out, num_threads, c_cpus)
        if rc != lib.ENVD_OK:
            raise NativeError(f"creating a pool of {num_threads} threads failed: "
                              f"{strerror(rc)} ({rc})", rc)
        self.handle = out[0]
        self.num_threads = num_threads

    def eventfd(self) -> int:
        """Readable when a NOTIFY job (a submitted step) completed."""
        return int(lib.envd_pool_eventfd(self.handle))

    def close(self) -> None:
        """Stop the workers.  Every vec using the pool must be destroyed first."""
        if self.handle != ffi.NULL:
            lib.envd_pool_destroy(self.handle)
            self.handle = ffi.NULL


def vec_buffers(spec: EnvSpec, buffers: dict[str, np.ndarray]) -> Any:
    """The envd_vec_buffers_t of buffers (as envd.buffer_layout);
    the caller keeps buffers alive as long as the vec."""
    final = buffers.get("final_observations")
    return ffi.new("envd_vec_buffers_t *", {
        "observations": ptr(buffers["observations"]), "actions": ptr(buffers["actions"]),
        "rewards": ptr(buffers["rewards"], "float *"),
        "terminations": ptr(buffers["terminations"], "bool *"),
        "truncations": ptr(buffers["truncations"], "bool *"),
        "final_observations": ffi.NULL if final is None else ptr(final),
        "episode_returns": ptr(buffers["episode_returns"], "double *"),
        "episode_lengths": ptr(buffers["episode_lengths"], "int64_t *"),
        "episode_times": ptr(buffers["episode_times"], "double *"),
        "dones": ptr(buffers["dones"], "bool *"),
        "info_fields": [ptr(buffers[INFO_PREFIX + field.name]) for field in spec.info_fields],
        "agent_mask": ptr(buffers["agent_mask"], "bool *") if "agent_mask" in buffers else ffi.NULL,
        "episode_log": (ptr(buffers["episode_log"], "double *") if "episode_log" in buffers
                        else ffi.NULL),
    })


def per_env_params(spec: EnvSpec, num_envs: int, params: list[float] | None) -> bool:
    """Whether params holds a row per env (EnvSpec.param_values) rather than
    one row for all; any other length is a caller's bug."""
    count = len(params or [])
    num_params = len(spec.params)
    if num_params and count == num_envs * num_params:
        return True
    if num_params and count not in (0, num_params):
        raise ValueError(f"{spec.id}: {count} parameter values for {num_envs} envs of "
                         f"{num_params} parameters")
    return False


def vec_config(num_envs: int, autoreset_mode: int, max_episode_steps: int, params: Any,
               per_env: bool = False, seeds: Any = ffi.NULL, private_rows: bool = False) -> Any:
    """The envd_vec_config_t (params: a cffi double array kept alive by the
    caller; per_env: it holds a row of values per env; seeds: NULL or env
    i's seed at [i], for the RNGs and the env's seed callback before init;
    private_rows: the buffers are this process's own memory, which no other
    process can write, so envs that read their observation rows back may
    write them directly: never true for a daemon's shared memory)."""
    return ffi.new("envd_vec_config_t *", {
        "num_envs": num_envs, "autoreset_mode": autoreset_mode,
        "max_episode_steps": max_episode_steps, "params": params, "per_env_params": per_env,
        "seeds": seeds, "private_rows": private_rows})


def set_doorbell_spinners(count: int) -> None:
    """How many doorbell threads of this process may spin at once."""
    lib.envd_doorbell_set_max_spinners(count)
