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
from envd.errors import ConnectionLostError, InvalidArgumentError, UntrustedPathError


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
        raise ConnectionLostError(
            f"no envd daemon at {endpoint}: {path} {reason}; start one with "
            "`envd --threads N` (or set ENVD_ENDPOINT to the daemon's endpoint)") from None
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
