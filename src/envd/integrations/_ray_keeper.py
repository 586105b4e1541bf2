"""The keeper of one Ray-placed envd daemon: ``python -m envd.integrations._ray_keeper
OWNER_PID FOLDER -- DAEMON_ARGV...`` (started by envd.integrations.ray's actor).

Why a keeper: Ray SIGKILLs an actor's child processes when the actor goes
(``ray.kill``, ``ray.shutdown``), and a SIGKILLed daemon cannot remove its
socket file or its shared-memory segments.  The keeper leaves the actor's
process tree at once (double fork, own session), so Ray does not reach it,
starts the daemon as its own child (SIGTERM when the keeper dies: prctl
PR_SET_PDEATHSIG) and waits on both the owner (the actor's process, through a
pidfd) and the daemon.  When the owner goes, the daemon gets SIGTERM (it
drains and removes its socket and segments), SIGKILL after a deadline; when
the daemon goes, however it died, the keeper removes its socket file and the
segments of dead daemons of its shared-memory namespace (shm_namespace), and
writes the exit status for the actor.  With the owner gone it also removes
FOLDER.

FOLDER holds: ``envd.sock`` (the daemon's ipc socket), ``daemon.pid`` (written
once the daemon runs), ``status`` (its exit status, negative for a signal),
``daemon.log`` (its output).
"""
from __future__ import annotations

import argparse
import ctypes
import os
import select
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping

#: prctl's option number (linux/prctl.h): the signal a child gets when its parent dies.
_PR_SET_PDEATHSIG = 1

#: Seconds a daemon may drain after SIGTERM before SIGKILL.
_DRAIN_S = 30.0


def _die_with_parent() -> None:  # runs in the forked child, before exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() == 1:  # the parent died before prctl: the signal would never come
        os._exit(1)


def _write(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="ascii") as f:
        f.write(text)
    os.replace(tmp, path)  # readers never see half a file


def _keep(owner_pid: int, folder: str, argv: list[str]) -> None:
    owner = os.pidfd_open(owner_pid)
    with open(os.path.join(folder, "daemon.log"), "wb") as log:
        daemon = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                  stderr=subprocess.STDOUT, preexec_fn=_die_with_parent,
                                  close_fds=True)
    _write(os.path.join(folder, "daemon.pid"), str(daemon.pid))
    daemon_fd = os.pidfd_open(daemon.pid)
    ready, _, _ = select.select([owner, daemon_fd], [], [])
    owner_gone = owner in ready
    if owner_gone and daemon.poll() is None:
        daemon.terminate()
        try:
            daemon.wait(_DRAIN_S)
        except subprocess.TimeoutExpired:
            daemon.kill()
    code = daemon.wait()
    with_socket = os.path.join(folder, "envd.sock")
    if os.path.exists(with_socket):
        os.unlink(with_socket)
    if code != 0:
        from envd.server.stale_segments import remove_stale_segments
        remove_stale_segments(namespace=shm_namespace(argv, os.environ))
    _write(os.path.join(folder, "status"), str(code))
    if owner_gone or _gone(owner):
        shutil.rmtree(folder, ignore_errors=True)


def shm_namespace(argv: list[str], environ: Mapping[str, str]) -> str:
    """The shared-memory namespace of the daemon that argv runs (``python -m
    envd FLAGS...``, or the ``envd`` script) in environ, read as the daemon
    reads it (server/config.py: --shm-namespace, else ENVD_SHM_NAMESPACE,
    else its --config file's); "" when none.  "" too when its settings do
    not parse: the daemon then refused to start before making a segment."""
    from envd.server import config, stale_segments

    flags = argv[3:] if argv[1:3] == ["-m", "envd"] else argv[1:]
    parser = argparse.ArgumentParser(add_help=False)
    config.add_arguments(parser)
    try:
        args, _ = parser.parse_known_args(flags)  # (a daemon subcommand's own flags: unknown)
        namespace = config.from_args(args, environ).shm_namespace or ""
        return stale_segments.check_namespace(namespace)
    except (SystemExit, ValueError, OSError):  # (argparse's errors exit)
        return ""


def _gone(pidfd: int) -> bool:
    return bool(select.select([pidfd], [], [], 0)[0])


def main(args: list[str]) -> None:
    owner_pid, folder, separator, *argv = args
    if separator != "--" or not argv:
        raise SystemExit("usage: python -m envd.integrations._ray_keeper OWNER_PID FOLDER -- "
                         "DAEMON_ARGV...")
    if os.fork() > 0:
        os._exit(0)  # the actor reaps this one; the keeper lives on outside its tree
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    _keep(int(owner_pid), folder, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
