"""NativeVec: one bare ``envd_vec_t`` over caller-owned buffers, with errors
in Python terms, for tests of the vec itself (dispatch, sanitizer controls).
The package steps every vec through a native session
(envd.native.native_session.NativeSession), which owns its vec; this class
is the tests' own, so the wheel ships no test-only class.  Not thread-safe:
the owner makes one call at a time (the vec is not re-entrant).
"""
from __future__ import annotations

import numpy as np

from envd.errors import EnvStateError, InvalidArgumentError, NativeError
from envd.native._envd_native import ffi, lib
from envd.native.native_vec import NativePool, per_env_params, ptr, strerror, vec_buffers, vec_config
from envd.native.registry import EnvSpec
from envd.vec_errors import step_error


class NativeVec:
    """num_envs instances of spec stepped over buffers (see envd.buffer_layout)."""

    def __init__(self, spec: EnvSpec, num_envs: int, *, autoreset_mode: int,
                 max_episode_steps: int, params: list[float], buffers: dict[str, np.ndarray],
                 pool: NativePool | None):
        self.spec = spec
        self.num_envs = num_envs
        self._buffers = buffers  # keeps the memory alive as long as the vec
        self._params = ffi.new("double[]", params or [0.0])
        self._c_buffers = vec_buffers(spec, buffers)
        self._seeds_ptr = ptr(buffers["reset_seeds"], "uint64_t *")
        self._mask_ptr = ptr(buffers["reset_mask"], "bool *")
        config = vec_config(num_envs, autoreset_mode, max_episode_steps, self._params,
                            per_env_params(spec, num_envs, params))
        out = ffi.new("envd_vec_t **")
        rc = lib.envd_vec_create(out, spec.definition, config, self._c_buffers,
                                 ffi.NULL if pool is None else pool.handle)
        self.check(rc, f"creating {num_envs} {spec.id} envs")
        self.handle = out[0]
        # The vec's private copy of the actions it checked (the buffer may be
        # shared memory a client rewrites): errors name the action it refused.
        actions = buffers["actions"]
        self._checked = {**buffers, "actions": np.frombuffer(
            ffi.buffer(lib.envd_vec_checked_actions(self.handle), actions.nbytes),
            actions.dtype).reshape(actions.shape)}

    # ---- calls ------------------------------------------------------------------------------
    def seed(self) -> None:
        """Seed every env's generator from the reset_seeds buffer (no reset)."""
        lib.envd_vec_seed(self.handle, self._seeds_ptr)

    def reset(self, with_seeds: bool, with_mask: bool) -> None:
        """Reset (the envs in reset_mask, or all), reseeding from reset_seeds first
        if with_seeds.  Blocks; releases the GIL while it runs."""
        rc = lib.envd_vec_reset(self.handle, self._seeds_ptr if with_seeds else ffi.NULL,
                                self._mask_ptr if with_mask else ffi.NULL)
        self.check(rc, "reset")
        # Checked on the vec's copy of the mask (the buffer may be shared memory
        # a client rewrites); an empty mask reset nothing, so refusing it now
        # is refusing it before.
        if with_mask and lib.envd_vec_reset_count(self.handle) == 0:
            raise InvalidArgumentError("options['reset_mask'] must have at least one True value")

    def step(self) -> int:
        """Step every env; the number of episodes that ended, or an envd error."""
        num_done = lib.envd_vec_step(self.handle)
        if num_done < 0:
            self.raise_step_error(num_done)
        return num_done

    def step_submit(self) -> None:
        """Start a step on the pool (or run it inline when cheap); see step_done."""
        rc = lib.envd_vec_step_submit(self.handle)
        if rc < 0:
            self.raise_step_error(rc)

    def step_done(self) -> bool:
        return bool(lib.envd_vec_step_done(self.handle))

    def step_finish(self) -> int:
        """Complete a submitted step once step_done(); as step()."""
        num_done = lib.envd_vec_step_finish(self.handle)
        if num_done < 0:
            self.raise_step_error(num_done)
        return num_done

    # ---- rendering ------------------------------------------------------------------------
    def render(self, out: np.ndarray) -> None:
        """Draw every env's current state into out, (num_envs,) + spec.render_shape
        uint8, C-contiguous.  Blocks; not while a step or batch is in flight."""
        frame_bytes = int(lib.envd_vec_frame_bytes(self.handle))
        if (out.dtype != np.uint8 or not out.flags.c_contiguous
                or out.nbytes != frame_bytes * self.num_envs or frame_bytes == 0):
            raise InvalidArgumentError(
                f"rendering {self.spec.id}: a frame buffer of shape "
                f"{(self.num_envs,) + (self.spec.render_shape or ())} uint8 is needed")
        base = out.ctypes.data
        for i in range(self.num_envs):
            rc = lib.envd_vec_render(self.handle, i, ffi.cast("uint8_t *", base + i * frame_bytes))
            if rc == lib.ENVD_ESTATE:
                raise EnvStateError(f"{self.spec.id}: env {i} has not been reset; "
                                    "call reset() before render()")
            self.check(rc, f"rendering env {i}")

    def destroy(self) -> None:
        """Free the envs (waits for a submitted step).  Idempotent."""
        if getattr(self, "handle", ffi.NULL) != ffi.NULL:
            lib.envd_vec_destroy(self.handle)
            self.handle = ffi.NULL

    def set_chunk(self, chunk: int) -> None:
        lib.envd_vec_set_chunk(self.handle, chunk)

    def stats(self) -> dict[str, float]:
        stats = ffi.new("envd_vec_stats_t *")
        lib.envd_vec_get_stats(self.handle, stats)
        return {"cost_ns_per_env": stats.cost_ns_per_env, "inline_jobs": stats.inline_jobs,
                "pooled_jobs": stats.pooled_jobs, "last_chunk": stats.last_chunk,
                "inline_step_ns_per_env": stats.inline_step_ns_per_env,
                "pooled_step_ns_per_env": stats.pooled_step_ns_per_env}

    # ---- errors ------------------------------------------------------------------------------
    def check(self, rc: int, what: str) -> None:
        if rc != lib.ENVD_OK:
            raise NativeError(f"{self.spec.id}: {what} failed: {strerror(rc)} ({rc})", rc)

    def raise_step_error(self, rc: int) -> None:
        index = int(lib.envd_vec_error_index(self.handle))
        if rc in (lib.ENVD_ERANGE, lib.ENVD_ESTATE, lib.ENVD_EBUSY, lib.ENVD_EENV):
            raise step_error(self.spec.id, self.spec.action_space, rc, index, self._checked)
        self.check(rc, "step")
