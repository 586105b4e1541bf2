"""Where a client connects: the checks made on an endpoint before any socket.

A trainer must not be served by a daemon someone else planted: envd's default
socket folder ($XDG_RUNTIME_DIR, else /tmp/envd-$UID) is refused when another
user owns it or may write it.  And an ipc endpoint with nothing listening is
reported at once rather than after the client's timeout.
"""
from __future__ import annotations

import os
import socket
from typing import Any

from envd import ownership, protocol
from envd.errors import ConnectionLostError, InvalidArgumentError, NoDaemonError, UntrustedPathError


def check_endpoint(endpoint: Any, timeout: float) -> str:
    """endpoint, checked before a socket is made: its scheme, then for an ipc
    endpoint envd's default folder (check_default_folder) and whether anything
    listens on the socket file (refused at once, not after a timeout)."""
    if not isinstance(endpoint, str) or not endpoint.startswith(("ipc://", "tcp://")):
        raise InvalidArgumentError(
            f"endpoint must be 'ipc:///path' or 'tcp://host:port', got {endpoint!r}")
    path = endpoint[len("ipc://"):]
    if not endpoint.startswith("ipc://") or path.startswith("@"):
        return endpoint
    check_default_folder(endpoint, os.path.dirname(path))
    # Fail at once, not after a timeout, when nothing listens on the socket file.
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(timeout)  # a stopped daemon's full backlog must not hang us
    try:
        probe.connect(path)
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        reason = "does not exist" if isinstance(exc, FileNotFoundError) else "has no listener"
        raise NoDaemonError(
            f"no envd daemon at {endpoint}{where_from(endpoint)}: {path} {reason}; start one "
            "with `envd --threads N` (or set ENVD_ENDPOINT to the daemon's endpoint)"
            f"{elsewhere(endpoint)}", endpoint) from None
    except PermissionError:
        raise ConnectionLostError(
            f"permission denied connecting to {path}: the daemon at {endpoint} "
            f"belongs to another user (this process runs as uid {os.getuid()}); start "
            "your own daemon, or use one whose socket folder lets you in") from None
    except OSError:
        pass  # e.g. a path too long for AF_UNIX: let ZeroMQ report it
    finally:
        probe.close()
    return endpoint


def where_from(endpoint: str, environ: Any = None) -> str:
    """Where the endpoint came from, for a message: " (ENVD_ENDPOINT)", the
    default and the $XDG_RUNTIME_DIR it follows, or "" (the caller's own)."""
    environ = os.environ if environ is None else environ
    if environ.get("ENVD_ENDPOINT"):
        return " (ENVD_ENDPOINT)" if endpoint == environ["ENVD_ENDPOINT"] else ""
    if endpoint != protocol.default_endpoint(environ):
        return ""
    runtime = environ.get("XDG_RUNTIME_DIR")
    because = f"$XDG_RUNTIME_DIR={runtime}" if endpoint.startswith(f"ipc://{runtime}/") \
        else "$XDG_RUNTIME_DIR " + ("is not a directory" if runtime else "is unset")
    return f" (the default endpoint: ENVD_ENDPOINT is unset and {because})"


def elsewhere(endpoint: str, environ: Any = None, places: Any = None) -> str:
    """For the default endpoint with no daemon: the other place the default
    can be (a shell with or without $XDG_RUNTIME_DIR computes another one;
    places: the socket paths to try, default /run/user/$UID and
    /tmp/envd-$UID) when a daemon listens there, as a hint; else ""."""
    environ = os.environ if environ is None else environ
    if environ.get("ENVD_ENDPOINT") or endpoint != protocol.default_endpoint(environ):
        return ""
    uid = os.getuid()
    for other in places or (f"/run/user/{uid}/envd.sock", f"/tmp/envd-{uid}/envd.sock"):
        if f"ipc://{other}" != endpoint and _listens(other):
            return (f". A daemon listens at ipc://{other}, the default of a shell whose "
                    f"$XDG_RUNTIME_DIR differs: set ENVD_ENDPOINT=ipc://{other} to reach it")
    return ""


def _listens(path: str) -> bool:
    """Whether something accepts connections on the unix socket at path."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()


def check_default_folder(endpoint: str, folder: str) -> None:
    """Refuse envd's default socket folder ($XDG_RUNTIME_DIR, else
    /tmp/envd-$UID) when another user owns it or may write it: in /tmp anyone
    could have created it first and put their daemon's socket in it, to read
    our observations and feed us theirs.  Other folders (an explicit ipc://
    endpoint or ENVD_ENDPOINT, e.g. a volume shared with a container) are the
    caller's choice and not checked, as the daemon does (server/daemon.py)."""
    builtin = protocol.default_endpoint({**os.environ, "ENVD_ENDPOINT": ""})
    if os.path.normpath(folder) != os.path.normpath(os.path.dirname(builtin[len("ipc://"):])):
        return
    try:
        info = os.lstat(folder)
    except FileNotFoundError:
        return  # no daemon there: the probe says so
    why = ownership.untrusted_reason(info, is_dir=True)
    if why is not None:
        raise UntrustedPathError(
            f"refusing to connect to {endpoint}: envd's default socket folder {folder} is not "
            f"safe: {why}. Another user may have created it to serve you their daemon. Check "
            f"it with `ls -ld {folder}`; if it is not yours, remove it (the daemon creates it "
            "with mode 0700) or connect to an explicit endpoint")
