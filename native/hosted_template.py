"""The template process: a preloaded Python that forks the workers hosting
Python envs (forkserver style).

One template per process that hosts envs, started on first use
(``template()``).  It has imported gymnasium, numpy, envd's native core and
the worker loop, and imports each env's module when it first describes or
spawns that env, so a second make of an env forks workers that import
nothing.  It dies with its parent (PR_SET_PDEATHSIG), and so do the workers
with it; it reaps its workers itself (SIGCHLD ignored: no zombies).

Control messages only (never per step): length-prefixed pickles over a
private socketpair, the segment's memfd passed with SCM_RIGHTS.  Both ends
are processes of the same user that trust each other; env creators travel
as cloudpickle (a lambda works).

    Every request carries the parent's sys.path (added to the template's,
    as multiprocessing's forkserver does), so an env creator pickled by
    reference (my_envs.MyEnv) imports in the template.

    describe(maker)  -> spaces and the env's time limit, and the measured
                        cost of one step (for the default worker count)
    spawn(maker, segment fd[, notify eventfd], layout, worker, begin, end,
          autoreset mode)
                     -> the worker's pid; the worker maps the segment,
                        makes its envs, sets its worker_state and serves
                        (writing the eventfd when the parent asks)
    import(modules)  -> None: the daemon's --import modules, imported once
"""
from __future__ import annotations

import atexit
import importlib
import ctypes
import os
import pickle
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
    from envd.native.hosted_worker import env_maker
    kind, env, max_episode_steps, env_kwargs = spec
    if kind == "creator":
        env = cloudpickle.loads(env)
    return env_maker(env, max_episode_steps, env_kwargs)


def _describe(spec: tuple) -> dict[str, Any]:
    """Make one env, read its spaces and time limit, time a few steps."""
    from envd.native.step_cost import measure_step_seconds
    env = _maker(spec)()
    try:
        limit = env.spec.max_episode_steps if env.spec is not None else None
        env.reset()  # (unseeded: the env's own seeding is the workers')
        env.action_space.seed(0)
        cost = measure_step_seconds(env)
        return {"observation_space": env.observation_space, "action_space": env.action_space,
                "max_episode_steps": limit, "step_seconds": cost}
    finally:
        env.close()


def _worker(sock: socket.socket, request: dict[str, Any], fds: list[int],
            template_pid: int) -> None:
    """The forked worker: never returns.  fds: the segment's memfd, then
    (a daemon's workers) the pool's eventfd to notify."""
    from envd.native.hosted_segment import WORKER_FAILED, WORKER_READY, Segment
    from envd.native.hosted_worker import EnvSlice, serve
    status = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the env's own subprocesses
        _die_with_parent(template_pid)
        sock.close()
        fd, notify_fd = fds[0], (fds[1] if len(fds) > 1 else -1)
        segment = Segment(fd, request["layout"], request["size"])
        os.close(fd)
        w = request["worker"]
        state = segment.arrays["worker_state"]
        try:
            env_slice = EnvSlice(_maker(request["spec"]), request["begin"], request["end"],
                                 segment, w, request["autoreset_mode"])
        except BaseException as exc:
            segment.write_message(w, request["begin"], f"{type(exc).__name__}: {exc}")
            state[w] = WORKER_FAILED
            raise
        state[w] = WORKER_READY
        serve(env_slice, request["spin_ns"], notify_fd)
        env_slice.close()
        status = 0
    finally:
        os._exit(status)


def _serve_template(sock: socket.socket) -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # workers are reaped by the kernel
    while True:
        try:
            request, fds = _recv(sock)
        except EOFError:
            return
        try:
            # The parent's import path, as multiprocessing's forkserver passes
            # it: a creator pickled by reference (my_envs.MyEnv) imports here.
            sys.path.extend(p for p in request.get("sys_path", ()) if p not in sys.path)
            if request["op"] == "import":
                for module in request["modules"]:
                    importlib.import_module(module)
                _send(sock, {"ok": None})
            elif request["op"] == "describe":
                _send(sock, {"ok": _describe(request["spec"])})
            elif request["op"] == "spawn":
                pid = os.fork()
                if pid == 0:
                    _worker(sock, request, fds, os.getppid())
                for fd in fds:
                    os.close(fd)
                _send(sock, {"ok": pid})
            else:
                _send(sock, {"error": f"unknown request {request['op']!r}"})
        except Exception as exc:
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
            _send(sock, {"error": f"{type(exc).__name__}: {exc}"})


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

    def alive(self) -> bool:
        return self.process.poll() is None

    def request(self, message: dict[str, Any], fds: tuple[int, ...] = ()) -> Any:
        """One request and its reply; RuntimeError with the template's message."""
        message = {**message, "sys_path": list(sys.path)}
        with self._lock:
            _send(self._sock, message, fds)
            reply, _ = _recv(self._sock)
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return reply["ok"]

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


def template() -> Template:
    """This process's template, started on first use (and again if it died,
    or in a child forked from a process that had one)."""
    global _template
    with _template_lock:
        if _template is not None and (_template._owner != os.getpid() or not _template.alive()):
            _template = None
        if _template is None:
            _template = Template()
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

