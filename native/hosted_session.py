"""HostedSession: a native session (native/src/session.h) whose backend is
Python envs in worker processes (native/src/backend_workers.c), or stepped
inline by the caller with num_workers=0.

The books, the refusals and the async rules are the native session's, so a
hosted env behaves as a built-in one; this class adds the workers' life
(spawned from the template, native/hosted_template.py; reclaimed at close)
and turns an env's failure into ``envd.EnvError``.
"""
from __future__ import annotations

import dataclasses
import os
import select
import signal
import socket
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from envd import info_codec, leaves
from envd.cpus import usable_cpus
from envd.errors import EnvError, EnvStateError, InvalidArgumentError, NativeError
from envd.native._envd_native import ffi, lib
from envd.native.hosted_agent_slice import AgentSlice
from envd.native.hosted_calls import MAX_REPLY_BYTES, MAX_REQUEST_BYTES, run_op
from envd.native.hosted_calls import recv as calls_recv
from envd.native.hosted_calls import send as calls_send
from envd.native.hosted_segment import WORKER_FAILED, WORKER_READY, Segment
from envd.native.hosted_template import Template, _maker, slice_class
from envd.native.hosted_worker import EnvSlice, spin_ns
from envd.native.native_session import NativeSession
from envd.native.native_vec import ptr
from envd.vec_errors import in_flight_error
from envd.vec_info import INFO_LENGTHS, INFO_SLOTS

#: A worker's call error of these types is raised as it is (gymnasium's own
#: vector envs raise them so): the rest as EnvError.
_CALL_ERRORS = {"AttributeError": AttributeError, "TypeError": TypeError,
                "ValueError": ValueError}

#: close() waits this long for envs in flight, then for workers to exit, before SIGKILL.
CLOSE_GRACE_SECONDS = 5.0


AUTORESET_CODES = {AutoresetMode.NEXT_STEP: lib.ENVD_AUTORESET_NEXT_STEP,
                   AutoresetMode.SAME_STEP: lib.ENVD_AUTORESET_SAME_STEP,
                   AutoresetMode.DISABLED: lib.ENVD_AUTORESET_DISABLED}


@dataclasses.dataclass
class HostedSpec:
    """What the session needs to know of a hosted env (NativeSession reads
    id, action_space and render_shape)."""
    id: str
    observation_space: spaces.Space
    action_space: spaces.Space
    max_episode_steps: int | None
    render_shape: tuple[int, ...] | None = None
    #: the info columns of its segment: (key, dtype str, shape of a value),
    #: see envd.vec_info.INFO_COLUMN_PREFIX (none: every info is encoded)
    info_columns: tuple[tuple[str, str, tuple[int, ...]], ...] = ()
    #: rows per env (a PettingZoo env's agents: its spaces are an agent's,
    #: every output buffer and the actions have num_envs * num_agents rows)
    num_agents: int = 1
    #: their names (a PettingZoo env's possible_agents, as described), which
    #: every env of its sessions must have (native/hosted_agent_slice.py)
    agent_names: tuple[str, ...] = ()


def slice_args(spec: HostedSpec, maker: tuple) -> dict[str, Any]:
    """The slice class's own arguments: a PettingZoo env's description,
    which each of its envs must match (AgentSlice's described)."""
    if maker[0] != "parallel":
        return {}
    return {"described": (spec.agent_names, spec.observation_space, spec.action_space)}


def slice_bounds(num_envs: int, num_workers: int, worker: int) -> tuple[int, int]:
    """Envs [begin, end) of worker (contiguous slices, as backend_workers.c)."""
    return worker * num_envs // num_workers, (worker + 1) * num_envs // num_workers


@ffi.def_extern(error=lib.ENVD_EENV)
def envd_hosted_run_inline(ctx: Any) -> int:
    """The backend's inline callback (num_workers=0): step the requested envs
    on the calling thread (env exceptions are caught per env).  Anything else
    (a KeyboardInterrupt in an env's step, say) fails the call and is raised
    again in the caller once the C call returned (_env_error)."""
    session = ffi.from_handle(ctx)
    try:
        session._slice.run_pending()
    except BaseException as exc:  # noqa: BLE001 -- a cffi callback must not raise: re-raised by the caller
        session._interrupted = exc
        return lib.ENVD_EENV
    return lib.ENVD_OK


#: Output arrays of which only a prefix of each row is meaningful -> the
#: segment's array of each row's length in bytes (uint32): the backend copies
#: only that prefix (an env's info slot: its msgpack bytes, mostly none).
USED_BYTES = {INFO_SLOTS: INFO_LENGTHS}


def client_leaves(segment: dict[str, np.ndarray], client: dict[str, np.ndarray] | None,
                  num_envs: int, num_agents: int = 1) -> tuple[list[tuple], list[tuple]]:
    """The (segment rows, client rows, row bytes) of every step input
    (envd.protocol.INPUT_ARRAYS but the reset's seeds and mask, which the
    backend copies whole) and every output array (envd.protocol.output_arrays)
    of client's layout, whatever their names: what the backend copies per env
    between the segment and the client's buffers (an env's row: its
    num_agents rows, consecutive).  ([], []) without client buffers.  Every
    array's first axis is the rows' (num_envs * num_agents rows)."""
    if client is None:
        return [], []
    from envd import protocol  # (the layout's names; no import cycle at module load)
    step_inputs = [name for name in protocol.INPUT_ARRAYS
                   if name in client and name not in ("reset_seeds", "reset_mask")]
    leaves: list[list[tuple]] = [[], []]
    for side, names in enumerate((step_inputs, protocol.output_arrays(client))):
        for name in names:
            mine, theirs = segment.get(name), client[name]
            if (mine is None or mine.shape != theirs.shape or mine.dtype != theirs.dtype
                    or mine.ndim < 1 or mine.shape[0] != num_envs * num_agents
                    or not (mine.flags.c_contiguous and theirs.flags.c_contiguous)):
                # a layout mismatch is a bug, not a client's doing
                raise RuntimeError(f"hosted session: the segment's {name} does not match the "
                                   "client's")
            if mine[0].nbytes:  # (an empty row has nothing to copy)
                used = segment.get(USED_BYTES.get(name, ""))
                leaves[side].append((ptr(mine), ptr(theirs), mine[0].nbytes * num_agents,
                                     ffi.NULL if used is None or side == 0
                                     else ptr(used, "uint32_t *")))
    return leaves[0], leaves[1]


class HostedSession(NativeSession):
    """num_envs Python envs (maker: hosted_template's env description) over
    segment, in num_workers worker processes forked by template (or inline)."""

    def __init__(self, spec: HostedSpec, num_envs: int, *, num_workers: int,
                 autoreset_mode: AutoresetMode, maker: tuple, segment: Segment, fd: int,
                 template: Template | None, notify_fd: int = -1,
                 client_buffers: dict[str, np.ndarray] | None = None,
                 timeout: float | None = None):
        """notify_fd: the daemon pool's eventfd, given to the workers, which
        write it when a step_submit or a send(notify=True) is done (-1: the
        caller waits itself, in-process).  client_buffers: the daemon's
        session's buffers in the client's shared memory (the same layout
        as the segment's batch buffers), which the session's callers and
        its doorbell use; the backend copies the rows of every input and
        output array between them and the segment itself, in C (see
        client_leaves).  None: the callers use the segment's own.
        timeout: the longest the workers may take to make their envs, and any
        call to wait for its envs (a hung env), in seconds; past it every
        worker is killed and the make or call raises EnvError (None: no
        bound)."""
        self.spec, self.num_envs, self.num_workers = spec, num_envs, num_workers
        self.autoreset_mode = autoreset_mode
        self.timeout = timeout
        self._slice_args = slice_args(spec, maker)
        self._interrupted: BaseException | None = None
        self.handle = self._backend = ffi.NULL
        self.segment: Segment | None = segment  # (None once closed)
        self.pids: list[int] = []
        self._pidfds: list[int] = []
        self._slice: EnvSlice | AgentSlice | None = None
        self._calls: list[socket.socket] = []  # per worker (native/hosted_calls.py)
        self._doorbell_refs = None
        buffers = self._buffers = segment.arrays
        self._client_buffers = client_buffers
        # (the backend copies the seeds and the mask privately before it reads them)
        inputs = client_buffers if client_buffers is not None else buffers
        self._seeds_ptr = ptr(inputs["reset_seeds"], "uint64_t *")
        self._mask_ptr = ptr(inputs["reset_mask"], "bool *")
        self._checked = {**buffers, "actions": buffers["checked_actions"]}
        try:
            if num_workers == 0:
                self._slice = slice_class(maker)(_maker(maker), 0, num_envs, segment, 0,
                                                 autoreset_mode, inline=True,
                                                 **self._slice_args)
            else:
                assert template is not None  # (the callers give one wherever there are workers)
                self._spawn(template, maker, fd, autoreset_mode, notify_fd)
            self._create_backend()
        except BaseException:
            self.close()
            raise

    # ---- setup ---------------------------------------------------------------------
    def _spawn(self, template: Template, maker: tuple, fd: int, mode: AutoresetMode,
               notify_fd: int) -> None:
        self._notify = notify_fd >= 0
        segment = self._open_segment()
        for w in range(self.num_workers):
            begin, end = slice_bounds(self.num_envs, self.num_workers, w)
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            self._calls.append(mine)
            try:
                pid, start = template.spawn(
                    {"spec": maker, "layout": segment.layout,
                     "size": segment.size, "worker": w, "begin": begin, "end": end,
                     "autoreset_mode": mode, "spin_ns": spin_ns(self.num_workers),
                     "slice_args": self._slice_args},
                    (fd, notify_fd, theirs.fileno()) if notify_fd >= 0
                    else (fd, theirs.fileno()))
            finally:
                theirs.close()
            try:
                # The worker waits on its start pipe: it cannot have exited
                # (and been reaped) yet, so this pidfd is that worker's.  If
                # this raises, the pipe closes unwritten and the worker exits.
                self._pidfds.append(os.pidfd_open(pid))
                self.pids.append(pid)
                os.write(start, b"\x01")
            finally:
                os.close(start)
        self._wait_ready()

    def _wait_ready(self) -> None:
        """Until every worker made its envs: EnvError if one failed, died, or
        (self.timeout) took too long (close() then kills them all)."""
        deadline = time.monotonic() + (self.timeout or float("inf"))
        segment = self._open_segment()
        state = segment.arrays["worker_state"]
        while not (state == WORKER_READY).all():
            if time.monotonic() > deadline:
                slow = [w for w in range(self.num_workers) if state[w] != WORKER_READY]
                raise EnvError(f"{self.spec.id}: making the envs of worker(s) {slow} took "
                               f"longer than {self.timeout:g} s; the workers were killed",
                               lib.ENVD_EENV)
            for w in range(self.num_workers):
                if state[w] == WORKER_FAILED:
                    _, text = segment.message(w)
                    raise EnvError(f"{self.spec.id}: making the envs of worker {w} failed: "
                                   f"{text}", lib.ENVD_EENV, slice_bounds(
                                       self.num_envs, self.num_workers, w)[0])
                if state[w] != WORKER_READY and self._exited(w):
                    raise EnvError(f"{self.spec.id}: worker {w} (pid {self.pids[w]}) died "
                                   "while making its envs", lib.ENVD_EENV)
            time.sleep(0.001)

    def _open_segment(self) -> Segment:
        """The segment, which close() drops (the setup reads it)."""
        if self.segment is None:
            raise EnvStateError(f"{self.spec.id}: this hosted session is closed")
        return self.segment

    def _exited(self, w: int) -> bool:
        return bool(select.select([self._pidfds[w]], [], [], 0)[0])

    def _create_backend(self) -> None:
        a = self._buffers
        agents = self.spec.num_agents
        agent_rows = "agent_mask" in a  # (a PettingZoo env's, whatever its agents)
        # (an env's actions: its agents' rows, each checked as the first's)
        row_bytes = a["actions"][0].nbytes
        checks = [(offset + k * row_bytes, *check) for k in range(agents)
                  for offset, *check in leaves.range_checks(self.spec.action_space)]
        self._checks_c = ffi.new("envd_action_check_t[]", [
            {"offset": offset, "size": size, "is_signed": signed, "low": low, "high": high}
            for offset, size, signed, low, high in checks] or 1)
        self._pidfds_c = ffi.new("int[]", self._pidfds or [0])
        self._pids_c = ffi.new("int[]", self.pids or [0])
        inputs, outputs = client_leaves(a, self._client_buffers, self.num_envs, agents)
        self._leaves = (ffi.new("envd_workers_leaf_t[]", inputs or 1),
                        ffi.new("envd_workers_leaf_t[]", outputs or 1))
        self._handle_ref = ffi.new_handle(self)
        self._config = ffi.new("envd_workers_config_t *", {
            "num_envs": self.num_envs, "num_workers": self.num_workers,
            "ctl": self._open_segment().ctl(0), "pidfds": self._pidfds_c,
            "kind": ptr(a["kind"], "uint8_t *"), "req": ptr(a["req"], "uint32_t *"),
            "ack": ptr(a["ack"], "uint32_t *"), "status": ptr(a["status"], "int32_t *"),
            "seeds": ptr(a["seeds"], "uint64_t *"),
            "seed_pending": ptr(a["seed_pending"], "uint8_t *"),
            "checked_actions": ptr(a["checked_actions"]), "actions": ptr(a["actions"]),
            "action_bytes": row_bytes * agents,
            "action_checks": self._checks_c, "num_action_checks": len(checks),
            # (the rows the rules keep, env_slot.h: the workers write the raw outputs)
            "agents": agents, "agent_rows": agent_rows,
            "rewards": ptr(a["rewards"], "double *"),
            "rows": {"terminations": ptr(a["terminations"], "bool *"),
                     "truncations": ptr(a["truncations"], "bool *"),
                     "episode_returns": ptr(a["episode_returns"], "double *"),
                     "episode_lengths": ptr(a["episode_lengths"], "int64_t *"),
                     "episode_times": ptr(a["episode_times"], "double *"),
                     "dones": ptr(a["dones"], "bool *"),
                     "agent_mask": ptr(a["agent_mask"], "bool *") if agent_rows else ffi.NULL},
            # (a multi-agent env's one observation leaf, whose dead rows the parent zeroes)
            **({"observations": ptr(a["observations"]), "obs_bytes": a["observations"][0].nbytes,
                "final_observations": ptr(a["final_observations"])
                if "final_observations" in a else ffi.NULL,
                "absent": ptr(a["absent"], "uint8_t *")} if agent_rows else {}),
            "spin_ns": spin_ns(self.num_workers),
            "autoreset_mode": AUTORESET_CODES[self.autoreset_mode],
            "run_inline": lib.envd_hosted_run_inline if self.num_workers == 0 else ffi.NULL,
            "inline_ctx": self._handle_ref, "notify": getattr(self, "_notify", False),
            "pids": self._pids_c, "inputs": self._leaves[0], "num_inputs": len(inputs),
            "outputs": self._leaves[1], "num_outputs": len(outputs),
            "timeout_ms": 0 if self.timeout is None else max(1, round(self.timeout * 1000)),
            "usable_cpus": usable_cpus()})
        backend = ffi.new("envd_backend_t **")
        self._check(lib.envd_backend_workers_create(backend, self._config),
                    "creating the hosted backend")
        out = ffi.new("envd_session_t **")
        rc = lib.envd_session_create(out, backend[0])  # (takes the backend over)
        self._check(rc, "creating the session")
        self._backend, self.handle = backend[0], out[0]
        # bare_step's call always releases the GIL: a hosted step waits for
        # worker processes or runs Python envs (its backend measures no cost)
        self._bind_step(may_hold_gil=False)

    # ---- errors ----------------------------------------------------------------------
    def _env_error(self, index: int) -> BaseException:
        """The EnvError of a call that failed with ENVD_EENV naming env index,
        in the backend's words (envd_backend_workers_message: the doorbell
        hands the same words to a fast-path client); or what interrupted an
        inline call (a KeyboardInterrupt is raised again as it is)."""
        if self._interrupted is not None:
            interrupted, self._interrupted = self._interrupted, None
            return interrupted
        dead = int(lib.envd_backend_workers_dead(self._backend))
        if dead >= 0:
            index = slice_bounds(self.num_envs, self.num_workers, dead)[0]
        text = ffi.new("char[]", lib.ENVD_HOSTED_MESSAGE_BYTES + 256)
        lib.envd_backend_workers_message(self._backend, index, text, len(text))
        return EnvError(f"{self.spec.id}: {ffi.string(text).decode('utf-8', 'replace')}",
                        lib.ENVD_EENV, index)

    def _step_error(self, rc: int, call: str = "step", index: int | None = None) -> BaseException:
        if rc == lib.ENVD_EENV:
            return self._env_error(self._index(index))
        return super()._step_error(rc, call, index)

    def _convert_env_failure(self, call, *args, backend_index: bool = False) -> Any:
        """call(*args), its ENVD_EENV NativeError turned into an EnvError."""
        try:
            return call(*args)
        except NativeError as exc:
            if exc.code != lib.ENVD_EENV or isinstance(exc, EnvError):
                raise
            # (the session records no env for a failed reset: the backend does)
            index = (lib.envd_backend_workers_error_index(self._backend) if backend_index
                     else lib.envd_session_error_index(self.handle))
            raise self._env_error(int(index)) from None

    def reset(self, with_seeds: bool, with_mask: bool) -> None:
        self._convert_env_failure(super().reset, with_seeds, with_mask, backend_index=True)

    def async_reset(self, with_seeds: bool) -> None:
        self._convert_env_failure(super().async_reset, with_seeds, backend_index=True)

    def send_error(self, rc: int, index: int | None = None) -> BaseException:
        if self._interrupted is not None:  # (inline: what stopped the run)
            return self._env_error(-1)
        return super().send_error(rc, index)

    def recv_error(self, rc: int, count: int, index: int | None = None) -> BaseException:
        if rc == lib.ENVD_EENV:
            return self._env_error(self._index(index))
        return super().recv_error(rc, count, index)

    def render(self, out: np.ndarray) -> None:
        raise InvalidArgumentError(f"{self.spec.id}: a hosted env's frames come from "
                                   "env_call({'op': 'render'})")

    def env_call(self, request: dict[str, Any]) -> list[Any]:
        """A render, call or set_attr request (native/hosted_calls.py) run on
        every env: the per-env results, in env order.  Refused while envs
        are in flight or ready (as a built-in env's render).  With workers,
        each runs it on its slice (set_attr's "values" are split by slice);
        an env's exception is raised again here as its type when it is an
        AttributeError, TypeError or ValueError, else as EnvError; a worker
        that does not answer within self.timeout is killed with the others
        (EnvError), as a hung step."""
        self._live()
        in_flight, ready = self.counts()
        if in_flight or ready:
            raise in_flight_error(self.spec.id, request["op"], in_flight + ready)
        if self._slice is not None:
            return run_op(self._slice.envs, request)
        bounds = [slice_bounds(self.num_envs, self.num_workers, w)
                  for w in range(self.num_workers)]
        if not self._calls:
            raise EnvError(f"{self.spec.id}: its workers were lost to an earlier call",
                           lib.ENVD_EENV)
        try:
            for sock, (begin, end) in zip(self._calls, bounds):
                part = request if request["op"] != "set_attr" else \
                    {**request, "values": list(request["values"][begin:end])}
                try:
                    data = info_codec.encode(part)
                except TypeError as exc:
                    raise TypeError(f"{self.spec.id}: the {request['op']} arguments hold "
                                    f"{exc}, which msgpack cannot carry to the workers "
                                    "(never pickled)") from None
                if len(data) > MAX_REQUEST_BYTES:
                    raise ValueError(f"{self.spec.id}: the {request['op']} request is "
                                     f"{len(data)} bytes encoded, over the "
                                     f"{MAX_REQUEST_BYTES}-byte bound")
                sock.settimeout(self.timeout)
                calls_send(sock, data)
            bound = min(MAX_REPLY_BYTES, request.get("max_bytes") or MAX_REPLY_BYTES)
            # (a daemon's request bounds the objects it decodes: "max_objects")
            replies = [info_codec.decode(calls_recv(sock, bound + 4096),  # (+ an error's)
                                         max_objects=request.get("max_objects"))
                       for sock in self._calls]
        except (OSError, EOFError) as exc:  # (socket.timeout is an OSError)
            self._kill_workers()
            self._drop_calls()
            what = (f"took longer than {self.timeout:g} s" if isinstance(exc, TimeoutError)
                    else f"lost its worker ({exc})")
            raise EnvError(f"{self.spec.id}: {request['op']} {what}; the workers were killed",
                           lib.ENVD_EENV) from None
        results: list[Any] = []
        for w, reply in enumerate(replies):
            if "error" in reply:
                kind = _CALL_ERRORS.get(reply.get("type"))
                text = f"{self.spec.id}: {request['op']} on worker {w}'s envs failed: " \
                       f"{reply['error']}"
                if kind is not None:
                    raise kind(text)
                raise EnvError(text, lib.ENVD_EENV, bounds[w][0])
            results += reply["ok"]
        return results

    def _drop_calls(self) -> None:
        calls, self._calls = self._calls, []
        for sock in calls:
            sock.close()

    def start_doorbell(self, segment, ids: np.ndarray, spin_ns: int) -> None:
        """As NativeSession's; only with client buffers (the daemon's
        sessions): the doorbell's segment is the client's.  Its serving
        thread spins for the next request only while it, the workers and
        the trainer fit the usable CPUs (envd.cpus), else it sleeps on the
        futex at once: a spinning serving thread would take the CPU of a
        worker stepping envs sent earlier."""
        if self._client_buffers is None:
            raise InvalidArgumentError(f"{self.spec.id}: an in-process hosted env has no "
                                       "doorbell")
        if self.num_workers + 2 > usable_cpus():
            spin_ns = 0
        super().start_doorbell(segment, ids, spin_ns)

    # ---- close ---------------------------------------------------------------------
    def _kill_workers(self, pidfds: list[int] | None = None) -> None:
        """SIGKILL the workers (through their pidfds: no pid reuse)."""
        for fd in self._pidfds if pidfds is None else pidfds:
            if fd >= 0:
                try:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def close(self, reap: Callable[[list[int]], None] | None = None) -> None:
        """Stop the workers (they leave their loop and close their envs;
        SIGKILL after CLOSE_GRACE_SECONDS, e.g. a hung env), free the
        session and the segment.  Idempotent; nothing is left: no process,
        no fd, no mapping (once the caller drops its views).

        reap: the daemon's event loop must not wait for workers: it passes a
        callable that takes the workers' pidfds (and closes them) and waits
        for their exit itself (server/hosted.py, WorkerReaper); envs still in
        flight then get their workers killed at once instead of a grace."""
        handle = getattr(self, "handle", ffi.NULL)
        pidfds = getattr(self, "_pidfds", [])
        if handle == ffi.NULL and pidfds:
            self._kill_workers()  # a failed make: nobody will tell them to exit
        elif handle != ffi.NULL and pidfds and self.counts()[0]:
            # The session's destroy waits for the envs in flight: a hung env
            # must not hang close.
            deadline = time.monotonic() + (0 if reap else CLOSE_GRACE_SECONDS)
            while self.counts()[0] and time.monotonic() < deadline:
                time.sleep(0.002)
            if self.counts()[0]:
                self._kill_workers()
        self._drop_calls()
        super().close()  # (the backend's destroy tells the workers to exit)
        self._pidfds = []
        if pidfds and reap is not None:
            reap(pidfds)
        elif pidfds:
            if not _wait_exited(pidfds, time.monotonic() + CLOSE_GRACE_SECONDS):
                self._kill_workers(pidfds)
                _wait_exited(pidfds, float("inf"))
            for fd in pidfds:
                os.close(fd)
        env_slice = getattr(self, "_slice", None)
        if env_slice is not None:
            env_slice.close()
            self._slice = None
        # (the handle is a reference cycle the collector does not see through)
        self._handle_ref = self._config = self._checks_c = None
        self._buffers, self._checked = {}, {}
        segment = getattr(self, "segment", None)
        if segment is not None:
            self.segment = None
            segment.close()


def _wait_exited(pidfds: list[int], deadline: float) -> bool:
    """Until every pidfd polls readable (its process exited), or the deadline."""
    while True:
        if all(select.select([fd], [], [], 0)[0] for fd in pidfds):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.002)
