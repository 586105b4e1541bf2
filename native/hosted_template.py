"""The template process: a preloaded Python that forks the workers hosting
Python envs (forkserver style).

One template per process that hosts envs, started on first use
(``template()``).  It has imported gymnasium, numpy, envd's native core and
the worker loop, and imports each env's module when it first describes or
spawns that env, so a second make of an env forks workers that import
nothing.  It dies with its parent (PR_SET_PDEATHSIG), and so do the workers
with it; it reaps its workers itself (SIGCHLD ignored: no zombies).
PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, so
the template is started from a thread of its own that lives as long as the
process (a first make from a short-lived thread must not kill it later).

The template never makes or steps an env itself: it imports the env's
module (a gymnasium id's entry point, a creator's references), and a child
forked for the purpose describes the env, so no env's threads, locks or
device state are inherited by the workers forked later, and nothing an
env's code raises or calls (SystemExit, os._exit) ends the template.

Control messages only (never per step): length-prefixed pickles over a
private socketpair, the segment's memfd passed with SCM_RIGHTS.  Both ends
are processes of the same user that trust each other; env creators travel
as cloudpickle (a lambda works).

    Every request carries the parent's sys.path (added to the template's,
    as multiprocessing's forkserver does), so an env creator pickled by
    reference (my_envs.MyEnv) imports in the template.

    describe(maker)  -> spaces and the env's time limit, and the measured
                        cost of one step (for the default worker count),
                        found by a child forked for it
    spawn(maker, segment fd[, notify eventfd], calls socket, layout, worker,
          begin, end, autoreset mode)
                     -> the worker's pid, and the write end of its start
                        pipe (SCM_RIGHTS).  The worker waits on that pipe
                        before anything else: the parent opens the worker's
                        pidfd (the worker cannot have exited and been
                        reaped meanwhile, so no pid is reused), then writes
                        one byte; a parent that could not (or died) closes
                        the pipe and the worker exits.  Then the worker maps
                        the segment, makes its envs, sets its worker_state
                        and serves (writing the eventfd when the parent asks),
                        and render/call/set_attr requests on the calls
                        socket from a thread (native/hosted_calls.py)
    import(modules)  -> None: the daemon's --import modules, imported once
"""
from __future__ import annotations

import atexit
import ctypes
import importlib
import os
import pickle
import queue
import signal
import socket
import struct
import subprocess
import sys
import threading
from typing import Any

import cloudpickle

_PR_SET_PDEATHSIG = 1
_HEADER = struct.Struct("<Q")


def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent exits (and exit now if the parent
    already did: the race between fork and prctl)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def _send(sock: socket.socket, message: Any, fds: tuple[int, ...] = ()) -> None:
    data = pickle.dumps(message)
    payload = _HEADER.pack(len(data)) + data
    sent = socket.send_fds(sock, [payload], list(fds)) if fds else sock.send(payload)
    if sent < len(payload):
        sock.sendall(payload[sent:])


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks = []
    while size:
        chunk = sock.recv(size)
        if not chunk:
            raise EOFError("the other end closed")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _recv(sock: socket.socket) -> tuple[Any, list[int]]:
    head, fds, _, _ = socket.recv_fds(sock, _HEADER.size, 4)
    if not head:
        raise EOFError("the other end closed")
    head += _recv_exact(sock, _HEADER.size - len(head))
    (size,) = _HEADER.unpack(head)
    return pickle.loads(_recv_exact(sock, size)), fds


# ---- the template's side ------------------------------------------------------------
def _maker(spec: tuple) -> Any:
    """The function making one env of a maker description: ("id", gymnasium
    id, max_episode_steps, kwargs), ("spec", an EnvSpec pickled, ...),
    ("creator", a creator pickled, ...) or ("parallel", a PettingZoo
    adapter creator pickled, None, {}: native/hosted_agent_slice.py)."""
    from envd.native.hosted_worker import env_maker
    kind, env, max_episode_steps, env_kwargs = spec
    if kind == "parallel":
        return cloudpickle.loads(env)
    if kind in ("creator", "spec"):  # (a spec: gymnasium's registration, shipped)
        env = cloudpickle.loads(env)
    return env_maker(env, max_episode_steps, env_kwargs)


def slice_class(spec: tuple) -> Any:
    """The class stepping a slice of the envs spec makes: AgentSlice for a
    PettingZoo env's ("parallel"), else EnvSlice."""
    if spec[0] == "parallel":
        from envd.native.hosted_agent_slice import AgentSlice
        return AgentSlice
    from envd.native.hosted_worker import EnvSlice
    return EnvSlice


class _Failed(Exception):
    """A request failed with a message meant for the parent as it is."""


def _preload(spec: tuple) -> None:
    """Import what making the env will import (never make it): a gymnasium
    id's entry point module, a creator's pickled references.  A failure here
    is left to the child that makes the env, which reports it."""
    kind, env, _, _ = spec
    try:
        if kind == "creator":
            cloudpickle.loads(env)
            return
        import gymnasium
        from gymnasium.envs.registration import load_env_creator
        entry_point = (cloudpickle.loads(env) if kind == "spec"
                       else gymnasium.spec(env)).entry_point
        if isinstance(entry_point, str):
            load_env_creator(entry_point)
    except Exception:  # noqa: BLE001 -- a warm-up only: making the env reports any failure
        pass


def _describe_in_child(spec: tuple) -> dict[str, Any]:
    """_describe(spec) in a child forked for it (the env's code never runs in
    the template); _Failed with "ExcType: message" if it raised, or if the
    child died before answering."""
    _preload(spec)
    template_pid = os.getpid()  # (before the fork: the child's getppid may be init's)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.close(read_end)
            _die_with_parent(template_pid)
            try:
                reply: dict[str, Any] = {"ok": _describe(spec)}
                data = pickle.dumps(reply)
            except BaseException as exc:  # noqa: BLE001 -- SystemExit from an env's code too
                data = pickle.dumps({"error": f"{type(exc).__name__}: {exc}"})
            with os.fdopen(write_end, "wb") as out:
                out.write(data)
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as answer:
        data = answer.read()
    if not data:
        raise _Failed("the process describing the env died before it answered (a crash in "
                      "the env's constructor, reset or step?)")
    reply = pickle.loads(data)
    if "error" in reply:
        raise _Failed(reply["error"])
    return reply["ok"]


def _describe(spec: tuple) -> dict[str, Any]:
    """Make one env, read its spaces and time limit, time a few steps (and
    see which of their info keys can be columns)."""
    from envd.native.hosted_worker import info_columns
    from envd.native.step_cost import measure_step_seconds
    env = _maker(spec)()
    if spec[0] == "parallel":
        return _describe_parallel(env)
    try:
        limit = env.spec.max_episode_steps if env.spec is not None else None
        env.reset()  # (unseeded: the env's own seeding is the workers')
        render_error = None
        if env.render_mode == "rgb_array":  # (one frame: can it draw here at all?)
            try:
                env.render()
            except Exception as exc:  # noqa: BLE001 -- e.g. MuJoCo without an offscreen OpenGL
                render_error = f"{type(exc).__name__}: {exc}"
        env.action_space.seed(0)
        infos: list[dict] = []
        cost = measure_step_seconds(env, infos=infos)
        return {"observation_space": env.observation_space, "action_space": env.action_space,
                "max_episode_steps": limit, "step_seconds": cost, "num_agents": 1,
                "possible_agents": [], "info_columns": info_columns(infos),
                "render_mode": env.render_mode, "render_fps": _fps(env.metadata),
                "render_error": render_error}
    finally:
        env.close()


def _fps(metadata: dict) -> float | None:
    fps = metadata.get("render_fps")
    return fps if isinstance(fps, (int, float)) else None


def _describe_parallel(env: Any) -> dict[str, Any]:
    """_describe of a PettingZoo env (a ParallelRows adapter): its agents'
    spaces and names, one step's cost with every agent's action sampled."""
    from envd.native._envd_native import lib
    from envd.native.step_cost import measure_step_seconds
    try:
        if env.num_agents > lib.ENVD_MAX_AGENTS:  # (SECURITY.md: the rows of an env)
            raise ValueError(f"{env.num_agents} possible agents, over the "
                             f"{lib.ENVD_MAX_AGENTS} an env may have")
        env.reset()
        render_error = None
        if env.render_mode == "rgb_array":
            try:
                env.render()
            except Exception as exc:  # noqa: BLE001 -- the env's own drawing
                render_error = f"{type(exc).__name__}: {exc}"
        env.action_space.seed(0)
        cost = measure_step_seconds(_Timed(env))
        return {"observation_space": env.observation_space, "action_space": env.action_space,
                "max_episode_steps": None, "step_seconds": cost, "num_agents": env.num_agents,
                "possible_agents": [str(a) for a in env.possible_agents], "info_columns": (),
                "render_mode": env.render_mode, "render_fps": _fps(env.metadata),
                "render_error": render_error}
    finally:
        env.close()


class _Timed:
    """A ParallelRows adapter as measure_step_seconds steps an env: every
    agent's action sampled, its episode over when every agent's is."""

    def __init__(self, env: Any):
        self.env = env
        self.action_space = self  # (sample() below)

    def sample(self) -> list:
        return [self.env.action_space.sample() for _ in range(self.env.num_agents)]

    def reset(self) -> None:
        self.env.reset()

    def step(self, actions: list) -> tuple:
        done = self.env.step(actions)[4]
        return None, 0.0, done, False, {}


def _spawn(sock: socket.socket, request: dict[str, Any], fds: list[int]) -> tuple[int, int]:
    """Fork a worker; (its pid, the write end of its start pipe)."""
    template_pid = os.getpid()  # (before the fork: the child's getppid may be init's)
    start_read, start_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(start_write)
        _worker(sock, request, fds, template_pid, start_read)
    os.close(start_read)
    return pid, start_write


def _worker(sock: socket.socket, request: dict[str, Any], fds: list[int],
            template_pid: int, start_fd: int) -> None:
    """The forked worker: never returns.  fds: the segment's memfd, then
    (a daemon's workers) the pool's eventfd to notify.  start_fd: the pipe
    the parent writes once it holds this worker's pidfd (EOF: exit)."""
    status = 1
    try:
        _die_with_parent(template_pid)
        sock.close()
        if os.read(start_fd, 1) != b"\x01":  # (EOF: the parent holds no pidfd of us)
            return
        os.close(start_fd)
        from envd.native.hosted_segment import WORKER_FAILED, WORKER_READY, Segment
        from envd.native.hosted_worker import serve
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the env's own subprocesses
        # fds: the segment's memfd, [the pool's eventfd,] the calls' socket
        fd, control_fd = fds[0], fds[-1]
        notify_fd = fds[1] if len(fds) > 2 else -1
        segment = Segment(fd, request["layout"], request["size"])
        os.close(fd)
        w = request["worker"]
        state = segment.arrays["worker_state"]
        try:
            env_slice = slice_class(request["spec"])(
                _maker(request["spec"]), request["begin"], request["end"], segment, w,
                request["autoreset_mode"], **request["slice_args"])
        except BaseException as exc:
            segment.write_message(w, request["begin"], f"{type(exc).__name__}: {exc}")
            state[w] = WORKER_FAILED
            raise
        from envd.native.hosted_calls import start_serving
        start_serving(env_slice.envs, control_fd)
        state[w] = WORKER_READY
        serve(env_slice, request["spin_ns"], notify_fd)
        env_slice.close()
        status = 0
    finally:
        os._exit(status)


def _answer(sock: socket.socket, request: dict[str, Any], fds: list[int]) -> tuple[Any, int]:
    """One request's result, and an fd to pass with it (-1: none)."""
    # The parent's import path, as multiprocessing's forkserver passes
    # it: a creator pickled by reference (my_envs.MyEnv) imports here.
    sys.path.extend(p for p in request.get("sys_path", ()) if p not in sys.path)
    if request["op"] == "import":
        for module in request["modules"]:
            importlib.import_module(module)
        return None, -1
    if request["op"] == "describe":
        return _describe_in_child(request["spec"]), -1
    if request["op"] == "spawn":
        _preload(request["spec"])  # (so that the next spawn of this env imports nothing)
        return _spawn(sock, request, fds)
    raise _Failed(f"unknown request {request['op']!r}")


def _serve_template(sock: socket.socket) -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # workers are reaped by the kernel
    while True:
        try:
            request, fds = _recv(sock)
        except EOFError:
            return
        # BaseException: an --import module's SystemExit, say, fails that
        # request; the template goes on serving.
        try:
            result, pass_fd = _answer(sock, request, fds)
            reply: dict[str, Any] = {"ok": result}
        except _Failed as exc:
            reply, pass_fd = {"error": str(exc)}, -1
        except BaseException as exc:  # noqa: BLE001 -- any failure is the requester's reply, never the template's end
            reply, pass_fd = {"error": f"{type(exc).__name__}: {exc}"}, -1
        for fd in fds:
            os.close(fd)
        try:
            _send(sock, reply, (pass_fd,) if pass_fd >= 0 else ())
        finally:
            if pass_fd >= 0:
                os.close(pass_fd)


def main() -> None:
    """The template's entry point: argv = [the socket's fd, the parent's pid]."""
    fd, parent = int(sys.argv[1]), int(sys.argv[2])
    _die_with_parent(parent)
    # Ctrl-C reaches the whole process group: the parent decides, not us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Preload what every worker needs (the point of the template).
    import gymnasium  # noqa: F401
    import numpy  # noqa: F401

    import envd.native.hosted_worker  # noqa: F401
    _serve_template(socket.socket(fileno=fd))


# ---- the parent's side --------------------------------------------------------------
class Template:
    """The parent's handle on its template process."""

    #: the pid of the process that started it (set by template())
    _owner: int

    def __init__(self) -> None:
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", "from envd.native.hosted_template import main; main()",
                 str(child_end.fileno()), str(os.getpid())], pass_fds=(child_end.fileno(),), stdin=subprocess.DEVNULL)
        except BaseException:
            parent_end.close()
            raise
        finally:
            child_end.close()
        self.pid = self.process.pid
        self._sock = parent_end
        self._lock = threading.Lock()
        self._gone = False  # an exchange found the socket closed

    def alive(self) -> bool:
        """Not known dead: not reaped, no exchange failed.  (A SIGKILLed
        template may look alive here for a while: waitpid cannot reap a
        process until all its threads have exited; see responds.)"""
        return not self._gone and self.process.poll() is None

    def responds(self) -> bool:
        """alive(), and it answers a no-op request: the kernel closes the
        socket once a killed template has fully exited, so this never
        returns True for a dead one."""
        if not self.alive():
            return False
        try:
            self.request({"op": "import", "modules": []})
        except RuntimeError:
            return False
        return True

    def request(self, message: dict[str, Any], fds: tuple[int, ...] = ()) -> Any:
        """One request and its reply; RuntimeError with the template's message."""
        result, received = self._exchange(message, fds)
        for fd in received:
            os.close(fd)
        return result

    def spawn(self, message: dict[str, Any], fds: tuple[int, ...]) -> tuple[int, int]:
        """A spawn request: (the worker's pid, its start pipe's write end,
        which the caller owns: write b"\\x01" once it opened the worker's
        pidfd, then close it; closing it unwritten makes the worker exit)."""
        pid, received = self._exchange({**message, "op": "spawn"}, fds)
        if len(received) != 1:  # (e.g. out of fds here: the kernel dropped it)
            for fd in received:
                os.close(fd)
            raise RuntimeError(f"the template's reply to a spawn carried {len(received)} "
                               "fds instead of 1 (out of file descriptors?)")
        return pid, received[0]

    def _exchange(self, message: dict[str, Any], fds: tuple[int, ...]) -> tuple[Any, list[int]]:
        message = {**message, "sys_path": list(sys.path)}
        with self._lock:
            try:
                _send(self._sock, message, fds)
                reply, received = _recv(self._sock)
            except (OSError, EOFError) as exc:  # (killed: the OOM killer, say)
                self._gone = True
                raise RuntimeError(f"the hosted-env template process (pid {self.pid}) is "
                                   f"gone ({exc}); the next make starts a new one") from None
        if "error" in reply:
            for fd in received:
                os.close(fd)
            raise RuntimeError(reply["error"])
        return reply["ok"], received

    def close(self) -> None:
        """End the template (it exits on EOF) and reap it."""
        self._sock.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


_template: Template | None = None
_template_lock = threading.Lock()
#: (the pid it was started in, the queue of its requests): the thread that
#: starts this process's templates (_start_template).
_starter: tuple[int, queue.SimpleQueue] | None = None


def _starter_loop(requests: queue.SimpleQueue) -> None:
    while True:
        answer = requests.get()
        try:
            answer.put(Template())
        except BaseException as exc:  # noqa: BLE001 -- handed to the waiting caller, which raises it
            answer.put(exc)


def _start_template() -> Template:
    """A new Template, started from this process's starter thread: it never
    exits before the process does, so the template's PR_SET_PDEATHSIG (which
    fires when the forking thread exits) fires only when the process ends.
    Called with _template_lock held."""
    global _starter
    if _starter is None or _starter[0] != os.getpid():  # (threads do not survive a fork)
        requests: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=_starter_loop, args=(requests,), daemon=True,
                         name="envd-template-starter").start()
        _starter = (os.getpid(), requests)
    answer: queue.SimpleQueue = queue.SimpleQueue()
    _starter[1].put(answer)
    result = answer.get()
    if isinstance(result, BaseException):
        raise result
    return result


def template() -> Template:
    """This process's template, started on first use (and again if it died,
    or in a child forked from a process that had one).  Its death is
    checked with a no-op request (Template.responds), not only with
    waitpid, which lags: a make right after the template was killed would
    otherwise fail with a broken pipe."""
    global _template
    with _template_lock:
        if _template is not None and (_template._owner != os.getpid()
                                      or not _template.responds()):
            _template = None
        if _template is None:
            _template = _start_template()
            _template._owner = os.getpid()
            atexit.register(shutdown)  # reaped at exit (it would die with us anyway)
        return _template


def shutdown() -> None:
    """End this process's template (tests; at exit it dies with the process)."""
    global _template
    atexit.unregister(shutdown)
    with _template_lock:
        if _template is not None and _template._owner == os.getpid():
            _template.close()
        _template = None

