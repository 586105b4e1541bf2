"""NativeVec: one ``envd_vec_t`` over caller-owned buffers, with errors in Python terms.

The in-process VecEnv and the daemon's sessions both drive the native vec
through this class; they differ only in where the buffers live (numpy arrays
vs. a shared-memory segment) and whose pool steps them.  Not thread-safe: the
owner makes one call at a time (the vec is not re-entrant).
"""
from __future__ import annotations

import numpy as np

from envd.errors import EnvdError, EnvStateError, InvalidArgumentError, NativeError
from envd.native._envd_native import ffi, lib
from envd.native.registry import EnvSpec
from envd.vector_base import INFO_PREFIX, send_error, step_error

#: The largest num_envs one vec accepts (1,048,576).
MAX_NUM_ENVS = int(lib.ENVD_VEC_MAX_ENVS)
MAX_THREADS = int(lib.ENVD_POOL_MAX_THREADS)


def ptr(array: np.ndarray, ctype: str = "void *"):
    return ffi.cast(ctype, array.ctypes.data)


def strerror(rc: int) -> str:
    return ffi.string(lib.envd_strerror(rc)).decode()


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


class NativeVec:
    """num_envs instances of spec stepped over buffers (see envd.vector_base.buffer_layout)."""

    def __init__(self, spec: EnvSpec, num_envs: int, *, autoreset_mode: int,
                 max_episode_steps: int, params: list[float], buffers: dict[str, np.ndarray],
                 pool: NativePool | None):
        self.spec = spec
        self.num_envs = num_envs
        self._buffers = buffers  # keeps the memory alive as long as the vec
        self._params = ffi.new("double[]", params or [0.0])
        final = buffers.get("final_observations")
        self._c_buffers = ffi.new("envd_vec_buffers_t *", {
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
        })
        self._seeds_ptr = ptr(buffers["reset_seeds"], "uint64_t *")
        self._mask_ptr = ptr(buffers["reset_mask"], "bool *")
        config = ffi.new("envd_vec_config_t *", {
            "num_envs": num_envs, "autoreset_mode": autoreset_mode,
            "max_episode_steps": max_episode_steps, "params": self._params})
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

    # ---- async batches --------------------------------------------------------------------
    def batch_submit(self, batch: "NativeBatch", env_ids: np.ndarray, notify: bool = False) -> None:
        """Start stepping env_ids (int64, contiguous) with their actions from the
        actions buffer; returns at once (or after running them inline when cheap)."""
        rc = lib.envd_vec_batch_submit(self.handle, batch.handle, ptr(env_ids, "int64_t *"),
                                       len(env_ids), lib.ENVD_JOB_NOTIFY if notify else 0)
        if rc != lib.ENVD_OK:
            index = int(lib.envd_vec_error_index(self.handle))
            raise send_error(self.spec.id, self.spec.action_space, self.num_envs, rc, index,
                             self._checked)
        batch.ids = env_ids

    def batch_done(self, batch: "NativeBatch") -> bool:
        return bool(lib.envd_vec_batch_done(batch.handle))

    def batch_wait(self, batch: "NativeBatch") -> None:
        """Block until the batch is done (the calling thread runs its chunks)."""
        lib.envd_vec_batch_wait(self.handle, batch.handle)

    def batch_finish(self, batch: "NativeBatch") -> int:
        """End a done batch; the number of its envs whose episode ended."""
        num_done = lib.envd_vec_batch_finish(self.handle, batch.handle)
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
                "pooled_jobs": stats.pooled_jobs, "last_chunk": stats.last_chunk}

    # ---- errors ------------------------------------------------------------------------------
    def check(self, rc: int, what: str) -> None:
        if rc != lib.ENVD_OK:
            raise NativeError(f"{self.spec.id}: {what} failed: {strerror(rc)} ({rc})", rc)

    def raise_step_error(self, rc: int) -> None:
        index = int(lib.envd_vec_error_index(self.handle))
        if rc in (lib.ENVD_ERANGE, lib.ENVD_ESTATE, lib.ENVD_EBUSY, lib.ENVD_EENV):
            raise step_error(self.spec.id, self.spec.action_space, rc, index, self._checked)
        self.check(rc, "step")


class NativeBatch:
    """A caller-owned async batch of up to capacity envs (see NativeVec.batch_submit)."""

    def __init__(self, capacity: int):
        out = ffi.new("envd_vec_batch_t **")
        rc = lib.envd_vec_batch_create(out, capacity)
        if rc != lib.ENVD_OK:
            raise NativeError(f"creating a batch of {capacity} envs failed: {strerror(rc)}", rc)
        self.handle = out[0]
        self.capacity = capacity
        self.ids: np.ndarray | None = None  # the envs of the submit in flight

    def close(self) -> None:
        """Free the batch; never while it is in flight."""
        if self.handle != ffi.NULL:
            lib.envd_vec_batch_destroy(self.handle)
            self.handle = ffi.NULL


class AsyncBatches:
    """The async batches of one NativeVec: those in flight (in submit order)
    and spares kept for reuse.  Used the same way by the in-process VecEnv and
    by the daemon's sessions; one caller thread at a time."""

    def __init__(self, vec: NativeVec):
        self.vec = vec
        self.in_flight: list[NativeBatch] = []
        # at most 2 * num_envs ids in all (sends of ever larger batches would
        # otherwise keep every size ever sent)
        self._spares: list[NativeBatch] = []

    def __bool__(self) -> bool:
        return bool(self.in_flight)

    def num_envs(self) -> int:
        """Envs in the batches in flight."""
        return sum(len(batch.ids) for batch in self.in_flight)

    def submit(self, env_ids: np.ndarray, notify: bool = False) -> None:
        """Start stepping env_ids (their actions are in the actions buffer)."""
        # (at most twice the size: the batches in flight hold <= 2 * num_envs ids)
        fits = [b for b in self._spares if len(env_ids) <= b.capacity <= 2 * len(env_ids)]
        batch = fits[0] if fits else NativeBatch(len(env_ids))
        if fits:
            self._spares.remove(batch)
        try:
            self.vec.batch_submit(batch, env_ids, notify)
        except BaseException:
            self._keep_spare(batch)
            raise
        self.in_flight.append(batch)

    def _keep_spare(self, batch: NativeBatch) -> None:
        if sum(b.capacity for b in self._spares) + batch.capacity > 2 * self.vec.num_envs:
            batch.close()
        else:
            self._spares.append(batch)

    def wait_oldest(self) -> None:
        """Block until some batch is done (the oldest's chunks are served first)."""
        if self.in_flight and not any(self.vec.batch_done(b) for b in self.in_flight):
            self.vec.batch_wait(self.in_flight[0])

    def collect(self) -> tuple[list[np.ndarray], EnvdError | None]:
        """End the finished batches: their env ids (submit order) and the first
        error of an env that failed in one (every finished batch is ended first,
        so no env is lost to the error)."""
        finished = [b for b in self.in_flight if self.vec.batch_done(b)]
        self.in_flight = [b for b in self.in_flight if b not in finished]
        error = None
        for batch in finished:
            try:
                self.vec.batch_finish(batch)
            except EnvdError as exc:
                error = error or exc
            self._keep_spare(batch)  # (ended: it may be freed)
        return [batch.ids for batch in finished], error

    def close(self) -> None:
        """Wait for the batches in flight (their chunks use the vec's memory),
        drop their results, free every batch.  Before the vec is destroyed."""
        for batch in self.in_flight:
            self.vec.batch_wait(batch)
            try:
                self.vec.batch_finish(batch)
            except EnvdError:
                pass  # an env failed; nobody waits for the result any more
        for batch in self.in_flight + self._spares:
            batch.close()
        self.in_flight, self._spares = [], []


class NativeFast:
    """The fast path's server thread for one vec (native/src/fast.h): it
    serves the steps, sends and recvs rung at the doorbell in the header page
    of ``segment`` (a writable buffer: the session's shared-memory mapping);
    sends and recvs pass env ids through ``ids`` (int64, num_envs, a view of
    the same segment)."""

    def __init__(self, vec: NativeVec, segment, ids: np.ndarray, spin_ns: int):
        self._memory = ffi.from_buffer(segment)  # keeps the mapping referenced
        self._ids = ids
        header = ffi.cast("envd_fast_header_t *", self._memory + lib.ENVD_FAST_OFFSET)
        out = ffi.new("envd_fast_t **")
        vec.check(lib.envd_fast_start(out, vec.handle, vec.num_envs, header,
                                      ptr(ids, "int64_t *"), spin_ns), "starting the fast path")
        self.handle = out[0]
        self._final = (0, 0)  # (steps, batch envs) once stopped

    def lock(self) -> None:
        """Wait for the request being served, then hold requests off."""
        lib.envd_fast_lock(self.handle)

    def try_lock(self) -> bool:
        """lock() if no request is being served now (never blocks)."""
        return bool(lib.envd_fast_trylock(self.handle))

    def unlock(self) -> None:
        lib.envd_fast_unlock(self.handle)

    def pending(self) -> int:
        """Envs sent through the doorbell and not received yet (hold the lock)."""
        return int(lib.envd_fast_pending(self.handle))

    def drain(self) -> None:
        """Answer every later request with 'shutting down'."""
        lib.envd_fast_drain(self.handle)

    def served(self) -> tuple[int, int]:
        """(steps, envs of sends found finished) served so far (all, once
        stopped); finished batches are collected first unless the thread
        serves a request now."""
        if self.handle == ffi.NULL:
            return self._final
        lib.envd_fast_collect(self.handle)
        return int(lib.envd_fast_served(self.handle)), int(lib.envd_fast_batch_envs(self.handle))

    def stop(self) -> None:
        """Stop the thread (after the request it serves), drop the envs sent
        and not received, and mark the doorbell closed.  Idempotent."""
        if getattr(self, "handle", ffi.NULL) != ffi.NULL:
            batch_envs = ffi.new("int64_t *")
            steps = int(lib.envd_fast_stop(self.handle, batch_envs))
            self._final = (steps, int(batch_envs[0]))
            self.handle = ffi.NULL


def set_fast_spinners(count: int) -> None:
    """How many fast-path threads of this process may spin at once."""
    lib.envd_fast_set_max_spinners(count)
