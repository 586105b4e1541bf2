"""Hosted Python envs served by the daemon (docs/python-envs.md).

The operator allows them at startup: ``--import MODULE`` (modules whose
``gymnasium.register`` calls add ids, imported in the daemon's template
process) and ``--python-env ID`` (the gymnasium ids clients may make, as
``py:ID``).  ``HostedCatalog`` describes each allowed id once, at startup, in
the template (the daemon's own Python never imports an env's module); a
client names an allowed id and never sends code, pickles or env kwargs.

A ``HostedServerSession`` is a Session whose stepping goes through a
``HostedNative``: a HostedSession (worker processes forked from the template,
over a private memfd segment only the daemon and its workers map) made with
the client's buffers, whose native backend copies the rows of each call's
inputs from the client's segment into the memfd (before it checks them) and
the finished envs' outputs back, in C (native/src/backend_workers.h,
"Leaves").  The workers' control words and the actions they act on thus
never lie in memory a client can write (the trust boundary of DESIGN.md
section 2), at the cost of a copy of a few bytes per env per step.  The
workers write the pool's eventfd when a submitted step or a batch is done
(ENVD_JOB_NOTIFY), so the stepping handlers serve hosted sessions as any;
and since the copies are the backend's, the doorbell's thread (the fast
path, native/src/doorbell.h) serves them as it serves native sessions.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import secrets
import select
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import cloudpickle
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from envd import info_codec, leaves
from envd.errors import (
    NATIVE_CODES,
    EnvdError,
    EnvError,
    EnvStateError,
    InvalidArgumentError,
    LimitExceededError,
    ShuttingDownError,
    UnknownEnvError,
)
from envd.hosted_pettingzoo import PETTINGZOO_PREFIX
from envd.make_options import PYTHON_PREFIX
from envd.native import hosted_template, segment_guard
from envd.native._envd_native import lib
from envd.native.hosted_calls import MAX_CALL_OBJECTS
from envd.native.hosted_env import DEFAULT_INFO_BYTES, check_space, default_num_workers, hosted_buffer_layout
from envd.native.hosted_pettingzoo import creator_of_id
from envd.native.hosted_segment import Segment as PrivateSegment
from envd.native.hosted_segment import segment_layout
from envd.native.hosted_session import CLOSE_GRACE_SECONDS, HostedSession, HostedSpec
from envd.native.hosted_template import Template, template
from envd.server.config import StartupError
from envd.server.lifecycle import Lifecycle
from envd.server.sessions import EXECUTOR_LOCK_WAIT_SECONDS, Session, async_in_flight, plan
from envd.shm import Segment

log = logging.getLogger("envd.server")

#: How long the event loop waits for a fast-path request of a hosted session
#: being freed before it kills the session's workers (HostedNative.stop_doorbell).
DOORBELL_STOP_WAIT_SECONDS = 0.05


def _one_line(exc: BaseException) -> str:
    """An error's message on one line (an env's may span several)."""
    return " ".join(str(exc).split()) or type(exc).__name__


@dataclasses.dataclass(frozen=True)
class HostedEnvSpec:
    """An allowed Python env as the daemon's books see it (the fields of a
    native EnvSpec they read; a hosted env has no native definition)."""
    id: str                      # "py:<gymnasium id>"
    gym_id: str                  # what gymnasium.make takes in the template
    observation_space: spaces.Space
    action_space: spaces.Space
    max_episode_steps: int | None
    step_seconds: float          # one env's step, measured at startup
    info_fields: tuple = ()
    render_shape: tuple[int, ...] | None = None
    render_fps: float | None = None
    params: tuple = ()
    origin: str = "python"
    definition: Any = None
    #: a "pz:" id's adapter creator, cloudpickled
    #: (native/hosted_agent_slice.py); None for a gymnasium id
    creator: bytes | None = None
    #: a "pz:" id's adapter creator whose factory takes render_mode="rgb_array"
    render_creator: bytes | None = None
    #: rows per env (a "pz:" env's possible agents, as a C multi-agent env's:
    #: every array has num_envs * num_agents rows; its spaces are an agent's)
    num_agents: int = 1
    #: their names (a "pz:" env's possible_agents), empty when unnamed
    agent_names: tuple[str, ...] = ()
    #: the info columns its sessions' segments carry (native/hosted_worker.py
    #: info_columns, as the template's description found them)
    info_columns: tuple = ()

    def maker(self, max_episode_steps: int | None, render_mode: str | None = None) -> tuple:
        """The template's description of how to make one env
        (native/hosted_template.py); render_mode: None or "rgb_array" (a
        gymnasium id's env, or a "pz:" id's factory, is made with it)."""
        if self.creator is not None:
            creator = self.creator if render_mode is None else self.render_creator
            return ("parallel", creator, None, {})
        kwargs = {} if render_mode is None else {"render_mode": render_mode}
        return ("id", self.gym_id, max_episode_steps, kwargs)

    def default_workers(self, num_envs: int) -> int:
        """num_workers=None: the in-process default, but at least one worker
        (the daemon never steps Python envs on its event loop thread)."""
        return max(1, default_num_workers(num_envs, self.step_seconds))


def private_plan(spec: HostedEnvSpec, num_envs: int, num_workers: int,
                 mode: AutoresetMode, info_bytes: int) -> tuple[dict, int]:
    """The layout and size of a hosted session's private segment."""
    buffers = hosted_buffer_layout(spec.observation_space, spec.action_space, num_envs, mode,
                                   info_bytes, spec.info_columns, spec.num_agents,
                                   agent_rows=bool(spec.agent_names))
    return segment_layout(num_envs, num_workers, buffers)


def public_plan(spec: HostedEnvSpec, num_envs: int, mode: AutoresetMode,
                info_bytes: int) -> tuple[dict[str, list], int]:
    """Where a hosted session's arrays lie in the client's segment, and its
    size (what --max-shm-bytes counts): the hosted buffers (one per
    observation leaf, float64 rewards, the info slots and columns) plus the
    doorbell ids."""
    layout = hosted_buffer_layout(spec.observation_space, spec.action_space, num_envs, mode,
                                  info_bytes, spec.info_columns, spec.num_agents,
                                  agent_rows=bool(spec.agent_names))
    layout["doorbell_ids"] = ((num_envs,), np.dtype(np.int64))  # protocol.DOORBELL_ARRAYS
    return plan(layout)


def hosted_state_plan(spec: HostedEnvSpec, num_envs: int, num_workers: int,
                      mode: AutoresetMode, info_bytes: int) -> int:
    """What --max-state-bytes counts for a hosted session: its private
    segment, the native session's books at their bound and its backend's
    (backend_workers.c: per env its slot and its agents' books, per agent
    the action row's checks; envd_backend_workers_bytes).  The workers' own
    memory is theirs, bounded by --max-workers."""
    layout, size = private_plan(spec, num_envs, num_workers, mode, info_bytes)
    checks = len(leaves.range_checks(spec.action_space)) * spec.num_agents
    return (size + int(lib.envd_session_books_max_bytes(num_envs))
            + int(lib.envd_backend_workers_bytes(num_envs, num_workers, spec.num_agents,
                                                 bool(spec.agent_names), len(layout), checks)))


class HostedCatalog:
    """The Python envs this daemon's operator allowed, described at startup."""

    def __init__(self, python_envs: tuple[str, ...] = (), imports: tuple[str, ...] = (),
                 timeout: float = 60.0):
        """timeout: --hosted-timeout, the longest the --import modules and
        each env's description may take at startup.  A failure stops the
        startup with StartupError, one line naming the flag and its value."""
        self.specs: dict[str, HostedEnvSpec] = {}
        self.imports = imports
        self.timeout = timeout
        self._template: Template | None = None
        self._killed = False
        if not python_envs and not imports:
            return
        # (started from a thread of its own that lives as long as the daemon:
        # native/hosted_template.py; the modules imported first, so a typo
        # stops the startup even without --python-env)
        self._within(f"--import {','.join(imports)} (ENVD_IMPORTS)", lambda: self.template)
        if not python_envs:
            log.warning("--import %s without --python-env: nothing to serve from it",
                        ", ".join(imports))
        for gym_id in python_envs:
            if gym_id.startswith(PETTINGZOO_PREFIX):  # a PettingZoo factory, agents as rows
                self.specs[gym_id] = self._describe_pettingzoo(gym_id)
                continue
            gym_id = gym_id.removeprefix(PYTHON_PREFIX)  # (--python-env py:ID means ID)
            self.specs[PYTHON_PREFIX + gym_id] = self._describe(gym_id)
        if self.specs:
            log.info("hosted Python envs: %s", ", ".join(self.specs))

    def _within(self, what: str, call: Callable[[], Any]) -> Any:
        """call() (a request to the template) within --hosted-timeout; a
        failure, or a call still running then (an import or env that hangs:
        the template is killed, and with it the child describing the env),
        is a StartupError naming what."""
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["ok"] = call()
            except BaseException as exc:  # noqa: BLE001 -- raised below, on the caller's thread
                outcome["error"] = exc
        thread = threading.Thread(target=run, name="envd-startup", daemon=True)
        thread.start()
        thread.join(self.timeout)
        if thread.is_alive():
            # (the template, whether or not the property handed it out yet:
            # it hangs in the --import modules otherwise)
            current = self._template or hosted_template._template
            if current is not None:
                current.process.kill()
            thread.join(self.timeout)
            raise StartupError(f"{what}: took longer than {self.timeout:g} s (--hosted-timeout) "
                               "at startup; a module or env that hangs?")
        error = outcome.get("error")
        if isinstance(error, (RuntimeError, EnvdError)):
            raise StartupError(f"{what}: {_one_line(error)}") from None
        if error is not None:
            raise error
        return outcome["ok"]

    def _describe(self, gym_id: str) -> HostedEnvSpec:
        name = PYTHON_PREFIX + gym_id
        flag = f"--python-env {gym_id} (ENVD_PYTHON_ENVS)"
        described = self._within(flag, lambda: self._describe_request(("id", gym_id, None, {})))
        try:
            for what in ("observation", "action"):
                check_space(described[f"{what}_space"], what, name)
        except InvalidArgumentError as exc:
            raise StartupError(f"--python-env {gym_id}: {_one_line(exc)}") from None
        return HostedEnvSpec(name, gym_id, described["observation_space"],
                             described["action_space"], described["max_episode_steps"],
                             described["step_seconds"],
                             info_columns=described["info_columns"],
                             render_fps=described["render_fps"])

    def _describe_request(self, spec: tuple) -> dict:
        try:
            return self.template.request({"op": "describe", "spec": spec})
        except RuntimeError as exc:
            raise RuntimeError(f"making the env failed: {exc}") from None

    def _describe_pettingzoo(self, env_id: str) -> HostedEnvSpec:
        """A "pz:<module>:<factory>" id: its ParallelEnv, made once in the
        template (a heterogeneous or broken env stops the startup)."""
        flag = f"--python-env {env_id} (ENVD_PYTHON_ENVS)"
        try:
            creator = cloudpickle.dumps(creator_of_id(env_id, {}))
            render_creator = cloudpickle.dumps(creator_of_id(env_id, {"render_mode": "rgb_array"}))
        except EnvdError as exc:
            raise StartupError(f"{flag}: making the env failed: {_one_line(exc)}") from None
        described = self._within(flag, lambda: self._describe_request(
            ("parallel", creator, None, {})))
        return HostedEnvSpec(env_id, env_id, described["observation_space"],
                             described["action_space"], None, described["step_seconds"],
                             creator=creator, render_creator=render_creator,
                             render_fps=described["render_fps"],
                             num_agents=described["num_agents"],
                             agent_names=tuple(described["possible_agents"]))

    @property
    def template(self) -> Template:
        """The daemon's template, with the --import modules imported (started
        again if it died: e.g. the OOM killer); ShuttingDownError once a
        drain killed it (kill)."""
        if self._killed:
            raise ShuttingDownError("the daemon is shutting down: its drain's grace passed "
                                    "and the hosted envs' processes were killed")
        current = template()
        if current is not self._template:
            if self.imports:
                current.request({"op": "import", "modules": list(self.imports)})
            self._template = current
        return current

    def ids(self) -> list[str]:
        return sorted(self.specs)

    def get(self, env_id: str) -> HostedEnvSpec:
        """The spec of an allowed id; UnknownEnvError (naming the allowed ones) otherwise."""
        spec = self.specs.get(env_id)
        if spec is None:
            allowed = ", ".join(self.ids()) or "none (the operator passed no --python-env)"
            raise UnknownEnvError(
                f"{env_id[:100]}: this daemon does not host that Python env; the ids its "
                f"operator allowed (--python-env) are: {allowed}")
        return spec

    def kill(self) -> None:
        """SIGKILL the template (the workers it forked die with it) and start
        no other: the drain's grace passed (Service._end_grace)."""
        self._killed = True
        if self._template is not None:
            self._template.process.kill()

    def close(self) -> None:
        """End the template (the workers of closed sessions are gone already)."""
        if self._template is not None:
            from envd.native.hosted_template import shutdown
            shutdown()
            self._template = None


class HostedNative:
    """What a hosted server session steps through: NativeSession's methods
    over a HostedSession made with the client's buffers (``public``), whose
    backend copies the rows of each call's inputs from them into the private
    segment and its outputs back, in C, on the calling thread (the event
    loop's, or the doorbell's: the fast path serves hosted sessions too)."""

    def __init__(self, hosted: HostedSession):
        self.hosted = hosted

    # ---- stepping -----------------------------------------------------------------------
    def seed(self) -> None:
        self.hosted.seed()

    def reset(self, with_seeds: bool, with_mask: bool) -> None:
        self.hosted.reset(with_seeds, with_mask)

    def async_reset(self, with_seeds: bool) -> None:
        self.hosted.async_reset(with_seeds)

    @property
    def handle(self):
        """The native session the daemon's request engine steps
        (envd.native.request_engine)."""
        return self.hosted.handle

    def step_result(self, result: int, index: int | None = None) -> int:
        return self.hosted.step_result(result, index)

    def recv_error(self, rc: int, count: int, index: int | None = None) -> BaseException:
        return self.hosted.recv_error(rc, count, index)

    def send_error(self, rc: int, index: int | None = None) -> BaseException:
        return self.hosted.send_error(rc, index)

    # ---- the rest, as NativeSession -------------------------------------------------------
    def counts(self) -> tuple[int, int]:
        return self.hosted.counts()

    def served(self) -> tuple[int, int]:
        return self.hosted.served()

    def lock(self) -> None:
        self.hosted.lock()

    def try_lock(self) -> bool:
        return self.hosted.try_lock()

    def unlock(self) -> None:
        self.hosted.unlock()

    def stats(self) -> dict[str, float]:
        return self.hosted.stats()

    def drain(self) -> None:
        self.hosted.drain()

    def start_doorbell(self, segment, ids: np.ndarray, spin_ns: int) -> None:
        self.hosted.start_doorbell(segment, ids, spin_ns)

    def stop_doorbell(self, kill_if_busy: bool = False) -> None:
        """Stop serving the doorbell (the event loop calls this when the
        session is freed or its fast path turned off).  The stop waits for
        the request the doorbell serves and for the envs sent through it
        that are still in flight, which a hung env could hold forever: if
        either still runs after DOORBELL_STOP_WAIT_SECONDS, then with
        kill_if_busy (the session is being freed) the workers are killed,
        and the wait ends within ENVD_HOSTED_POLL_MS (the request is answered
        with the dead worker's EnvError, the batch dropped); without it (a
        live session's "fast off") nothing is stopped or killed and
        EnvStateError says the session is busy."""
        hosted = self.hosted
        deadline = time.monotonic() + DOORBELL_STOP_WAIT_SECONDS
        while True:
            locked = hosted.try_lock()  # (fails while a request runs; between a
            # SENDRECV's halves its envs are in flight: busy below)
            try:
                busy = not locked or hosted.counts()[0] > 0
                if not busy or time.monotonic() > deadline:
                    if busy and not kill_if_busy:
                        raise EnvStateError(
                            f"{hosted.spec.id}: stopping the fast path while a request it "
                            "serves, or a batch sent through it, still runs; retry once "
                            "it returns (a hung env's: close the session)")
                    if busy:
                        log.warning("%s: a fast-path request or batch still runs as its "
                                    "session is freed; killing its workers", hosted.spec.id)
                        hosted._kill_workers()
                    hosted.stop_doorbell()
                    return
            finally:
                if locked:
                    hosted.unlock()
            time.sleep(0.001)

    def render(self, out: np.ndarray) -> None:
        self.hosted.render(out)

    def close(self, reap: Callable[[list[int]], None] | None = None) -> None:
        """Stop the workers (SIGKILL after the grace period) and free the
        private segment; idempotent.  reap: see HostedSession.close."""
        self.hosted.close(reap)


class WorkerReaper:
    """Waits on the event loop for the workers of freed hosted sessions to
    exit, so that a close never blocks the loop (a worker whose env's close
    hangs, say): each pidfd gets a reader that closes it once the worker
    exited, and the workers still alive after CLOSE_GRACE_SECONDS are
    SIGKILLed.  Owned by the event loop thread."""

    def __init__(self, add: Callable[..., None], remove: Callable[[int], object]):
        self._add, self._remove = add, remove
        # pidfds of workers not seen exiting yet -> the reap call that took them
        # over (a closed pidfd's number is reused by a later reap: its grace
        # timer must not kill that later session's workers)
        self._waiting: dict[int, int] = {}
        self._reaps = 0

    @property
    def pending(self) -> int:
        """Workers told to exit and not seen exiting yet (--max-workers
        counts them)."""
        return len(self._waiting)

    def reap(self, pidfds: list[int]) -> None:
        """Take pidfds over (the workers were told to exit)."""
        self._reaps += 1
        for fd in pidfds:
            self._waiting[fd] = self._reaps
            self._add(fd, self._exited, fd)
        asyncio.get_running_loop().call_later(CLOSE_GRACE_SECONDS, self._kill, list(pidfds),
                                              self._reaps)

    def _exited(self, fd: int) -> None:
        if fd in self._waiting:
            del self._waiting[fd]
            self._remove(fd)
            os.close(fd)

    def _kill(self, pidfds: list[int], reap: int) -> None:
        late = [fd for fd in pidfds if self._waiting.get(fd) == reap]
        if late:
            log.warning("%d worker(s) of a closed hosted session still ran %g s after "
                        "being told to exit (an env's close hangs?); killing them",
                        len(late), CLOSE_GRACE_SECONDS)
        for fd in late:
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        """At shutdown: SIGKILL what is left, wait for it, close every pidfd."""
        for fd in list(self._waiting):
            self._remove(fd)
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            except ProcessLookupError:
                pass
            # (a SIGKILLed process exits promptly, unless stuck in the kernel,
            # e.g. uninterruptible I/O: shutdown does not wait for it forever)
            if not select.select([fd], [], [], CLOSE_GRACE_SECONDS)[0]:
                log.warning("a hosted worker did not exit %g s after SIGKILL; not waiting "
                            "for it", CLOSE_GRACE_SECONDS)
            os.close(fd)
        self._waiting.clear()


class HostedServerSession(Session):
    """A session of num_envs envs of an allowed Python env in num_workers
    worker processes (see the module docstring)."""

    spec: HostedEnvSpec
    _native: HostedNative | None

    @property
    def native(self) -> HostedNative:
        """What steps the envs; RuntimeError once the session was freed (as Session's)."""
        native = self._native
        if native is None:
            raise RuntimeError(f"session {self.id} ({self.spec.id}) was freed: its envs are gone")
        return native

    def __init__(self, owner: bytes, spec: HostedEnvSpec, num_envs: int, mode: AutoresetMode,
                 max_episode_steps: int | None, seeds: np.ndarray, num_workers: int,
                 segment_prefix: str, template: Template, notify_fd: int,
                 on_free: Callable[[Session, bool], None] | None = None,
                 info_bytes: int = DEFAULT_INFO_BYTES, timeout: float | None = None,
                 render_mode: str | None = None):
        """timeout: --hosted-timeout, the longest the make, a reset, a render
        or a call may wait for the workers (HostedSession's timeout).
        render_mode: None or "rgb_array" (a gymnasium id's envs are made with it)."""
        # (Session.__init__ builds a native vec; this sets the same fields.)
        self.id = secrets.token_hex(16)
        self.owner = owner
        self.spec = spec
        self.num_envs = num_envs
        self.num_agents = spec.num_agents
        self.num_workers = num_workers
        self.mode = mode
        self.max_episode_steps = max_episode_steps or spec.max_episode_steps or 0
        self.steps = 0
        self.env_steps = 0
        self.created = time.monotonic()
        self.batch_size = num_envs
        self.max_threads = None  # (the workers step hosted envs, not the pool: no cap)
        self.render_mode = render_mode
        self.fast_path = False
        self._counted = (0, 0)
        self._last_stats: dict[str, float] = {"inline_jobs": 0, "pooled_jobs": 0}
        arrays, size = public_plan(spec, num_envs, mode, info_bytes)
        self.segment_bytes = size
        self.state_bytes = hosted_state_plan(spec, num_envs, num_workers, mode, info_bytes)
        self.segment = Segment.create(segment_prefix + self.id, self.id, arrays, size,
                                      mapper=segment_guard.map_segment)
        self._arrays = arrays
        self._native = None
        try:
            self.buffers = self.segment.arrays
            self.buffers["reset_seeds"][:num_envs] = seeds  # (one per env, not per row)
            layout, private_size = private_plan(spec, num_envs, num_workers, mode, info_bytes)
            private, fd = PrivateSegment.create(layout, private_size)
            try:
                hosted = HostedSession(
                    HostedSpec(spec.id, spec.observation_space, spec.action_space,
                               self.max_episode_steps or None, num_agents=spec.num_agents,
                               agent_names=spec.agent_names),
                    num_envs, num_workers=num_workers, autoreset_mode=mode,
                    maker=spec.maker(max_episode_steps, render_mode), segment=private, fd=fd,
                    template=template, notify_fd=notify_fd, client_buffers=self.buffers,
                    timeout=timeout)
            except BaseException:
                private.close()
                raise
            finally:
                os.close(fd)  # the workers have theirs
            native = self._native = HostedNative(hosted)
            native.seed()
        except BaseException:
            if self._native is not None:
                self._native.close()
            self.segment.unlink()
            raise
        self.life = Lifecycle(self.id, free=self._freed_by_lifecycle,
                              outstanding=self.batches_in_flight)
        self._on_free = on_free
        self._reclaim_armed = False
        #: Set by the daemon (Service.reaper): takes the workers' pidfds at an
        #: orderly free, so that the event loop never waits for them.
        self.reap: Callable[[list[int]], None] | None = None

    def watch_workers(self, add: Callable[..., None], remove: Callable[[int], object],
                      on_exit: Callable[[], None]) -> None:
        """Call on_exit (the pool-event handler: the step or recv waiting for
        a dead worker's envs is answered with its EnvError) when a worker
        exits, through the event loop's readers add/remove on its pidfd (a
        reader of an exited worker is removed at once: it stays readable)."""
        self._remove_reader = remove
        self._watched = [fd for fd in self.native.hosted._pidfds if fd >= 0]

        def exited(fd: int) -> None:
            self._unwatch(fd)
            on_exit()
        for fd in self._watched:
            add(fd, exited, fd)

    def _unwatch(self, fd: int) -> None:
        if fd in self._watched:
            self._watched.remove(fd)
            self._remove_reader(fd)

    def stop_doorbell(self, freeing: bool = False) -> None:
        """Stop serving the doorbell: see HostedNative.stop_doorbell (a hosted
        env's request may hang; its workers are killed only when freeing)."""
        self.native.stop_doorbell(kill_if_busy=freeing)
        self.fast_path = False

    def async_reset(self, with_seeds: bool) -> None:
        """As Session's, but with the fast path on, refused while envs sent
        through the doorbell are in flight: the reset would wait for them on
        the executor, holding the session's lock, as long as a hung env."""
        with self.locked("async reset", EXECUTOR_LOCK_WAIT_SECONDS):
            if self.fast_path and self.native.counts()[0]:
                raise async_in_flight("async reset of a hosted session on the fast path")
            self.native.async_reset(with_seeds)

    def reclaim_later(self, why: str = "closed") -> None:
        """Closed (CLOSING), or the daemon drains, while a call runs or
        batches are in flight: if that has not ended after
        CLOSE_GRACE_SECONDS (an env that hangs), SIGKILL the workers; their
        pidfds wake the event loop, the call ends with an EnvError (nobody
        reads it once closed), and the session is freed or the drain ends.
        Armed once per session."""
        if self._reclaim_armed:
            return
        self._reclaim_armed = True

        def kill() -> None:
            if not self.life.freed and self._native is not None and self.busy_or_in_flight():
                log.warning("session %s (%s): %s, but its call still runs after %g s; "
                            "killing its workers", self.id[:8], self.spec.id, why,
                            CLOSE_GRACE_SECONDS)
                self.native.hosted._kill_workers()
        asyncio.get_running_loop().call_later(CLOSE_GRACE_SECONDS, kill)

    def kill_workers(self) -> None:
        """SIGKILL the workers now (the drain's grace passed); the call that
        waits for them ends with an EnvError."""
        if not self.life.freed and self._native is not None:
            self._native.hosted._kill_workers()

    def _freed_by_lifecycle(self, orderly: bool) -> None:
        if not orderly:  # at shutdown the loop reaps no more: close waits for them
            self.reap = None
        super()._freed_by_lifecycle(orderly)

    def busy_or_in_flight(self) -> bool:
        """A call runs (step, reset, make...) or envs are in flight.  Never
        blocks: a session lock held by someone else (a reset on the
        executor, a doorbell serving a request) means a call runs."""
        return self.life.busy or self.in_flight_or_held()

    def free(self) -> None:
        """Stop watching the workers, then free as any session; the workers'
        pidfds go to the reaper (the loop waits for no worker), or at
        shutdown are waited for here."""
        for fd in list(getattr(self, "_watched", ())):
            self._unwatch(fd)
        native = getattr(self, "_native", None)
        if native is not None and self.reap is not None:
            native.close(self.reap)  # (then super().free's close is a no-op)
        super().free()

    @property
    def worker_pids(self) -> list[int]:
        """The session's worker processes (empty once freed)."""
        return list(self._native.hosted.pids) if self._native is not None else []

    def render(self, max_bytes: int) -> np.ndarray:
        """Every env's frame, drawn in the workers (on the executor, the
        session's lock held: no doorbell step meanwhile), stacked as a
        built-in session's: (num_envs, height, width, 3) uint8.  Each
        worker's reply is bounded by max_bytes (--max-message-bytes), and so
        are the frames together: over it, LimitExceededError."""
        with self.locked("render", EXECUTOR_LOCK_WAIT_SECONDS):
            try:
                frames = self.native.hosted.env_call({"op": "render", "max_bytes": max_bytes,
                                                      "max_objects": MAX_CALL_OBJECTS})
            except ValueError as exc:
                if "-byte bound" not in str(exc):  # (a worker's reply over the bound)
                    raise
                raise LimitExceededError(f"{exc} (--max-message-bytes)") from None
        shapes = {getattr(f, "shape", None) for f in frames}
        if len(shapes) != 1 or not all(isinstance(f, np.ndarray) and f.dtype == np.uint8
                                       and f.ndim == 3 and f.shape[2] == 3 for f in frames):
            raise EnvError(f"{self.spec.id}: its envs' render() returned "
                           f"{sorted(map(str, shapes))[:3]}, not RGB uint8 frames of one "
                           "shape", NATIVE_CODES["EENV"])
        size = sum(f.nbytes for f in frames)
        if size > max_bytes:
            raise LimitExceededError(f"rendering {self.num_envs} {self.spec.id} envs makes "
                                     f"{size} bytes of frames, over the daemon's message limit "
                                     f"of {max_bytes} bytes (--max-message-bytes)")
        return np.stack(frames)

    def env_call(self, request: dict[str, Any], max_bytes: int) -> bytes:
        """A call or set_attr request (native/hosted_calls.py; checked by the
        caller) run in the workers on the executor, the session's lock held;
        the per-env results info_codec-encoded (what the reply's blob
        carries), at most max_bytes (--max-message-bytes): over it,
        LimitExceededError.  Never pickle: the request came decoded from
        the client's msgpack."""
        with self.locked(request["op"], EXECUTOR_LOCK_WAIT_SECONDS):
            try:
                results = self.native.hosted.env_call({**request, "max_bytes": max_bytes,
                                                       "max_objects": MAX_CALL_OBJECTS})
            except (AttributeError, TypeError, ValueError) as exc:
                if "-byte bound" in str(exc):
                    raise LimitExceededError(f"{exc} (--max-message-bytes)") from None
                # (the worker's words name the type: the client raises that type again)
                raise InvalidArgumentError(str(exc)) from None
        data = info_codec.encode(results)
        if len(data) > max_bytes:
            raise LimitExceededError(f"{self.spec.id}: the {request['op']} results are "
                                     f"{len(data)} bytes encoded, over the daemon's message "
                                     f"limit of {max_bytes} bytes (--max-message-bytes)")
        return data
