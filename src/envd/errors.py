"""The one exception hierarchy of envd.

Every error envd raises on purpose is an ``EnvdError``.  Subclasses also derive
from the matching builtin (``ValueError``, ``RuntimeError``, ``TimeoutError``...)
so code written against gymnasium's conventions keeps catching them.

Each class carries ``error_code``, the name the daemon puts on the wire for it
(see envd.protocol.ERROR_CODES): an error raised inside the daemon reaches the
client as the same class with the same message, so a remote env fails exactly
as an in-process one would.

The native core's own codes (``NativeError.code``, the fast path's statuses)
come from envd.h's one table (ENVD_ERRNO_MAP), generated into
envd._native_facts at build time: ``NATIVE_CODES`` and ``native_strerror``
name them without loading native code.
"""
from __future__ import annotations

from envd import _native_facts

#: envd.h's error codes by name without ``ENVD_``: {"OK": 0, "EINVAL": -1, ...}.
NATIVE_CODES: dict[str, int] = {name.removeprefix("ENVD_"): code
                                for name, (code, _) in _native_facts.ERRORS.items()}
_NATIVE_MESSAGES = {code: f"{message} ({name})"
                    for name, (code, message) in _native_facts.ERRORS.items()}


def native_strerror(code: int) -> str:
    """envd_strerror's message for a native error code, with the code's name
    (e.g. "resource busy (ENVD_EBUSY)"), without loading the native core."""
    return _NATIVE_MESSAGES.get(code, f"unknown error code ({code})")


class EnvdError(Exception):
    """Base class of every error raised by envd."""

    error_code = "internal"


class UnknownEnvError(EnvdError, ValueError):
    """No env is registered under the requested id."""

    error_code = "unknown_env"


class InvalidArgumentError(EnvdError, ValueError):
    """A call got an argument it cannot accept (num_envs, seeds, kwargs, modes...)."""

    error_code = "invalid_argument"


class InvalidActionError(EnvdError, ValueError):
    """Actions of the wrong shape or dtype, or a discrete action out of range."""

    error_code = "invalid_action"


class EnvStateError(EnvdError, RuntimeError):
    """The call is not valid in the env's current state (closed, not reset, done, busy)."""

    error_code = "env_state"


class NativeError(EnvdError, RuntimeError):
    """The native core failed unexpectedly; ``code`` is its ENVD_E* error code."""

    error_code = "native"

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


class EnvError(NativeError):
    """An env's own code failed: a hosted Python env raised in its reset or
    step (the message names the env index, the exception type and its
    message), or the worker process hosting it died.  ``code`` is ENVD_EENV;
    ``env_index`` the env (-1: none).  A NativeError, so code catching the
    native core's env failures catches these too; over the wire its code is
    ``env_error`` (with ``native_code`` and ``env_index``)."""

    error_code = "env_error"

    def __init__(self, message: str, code: int, env_index: int = -1):
        super().__init__(message, code)
        self.env_index = env_index


class ProtocolError(EnvdError, ValueError):
    """A message the other side cannot accept: malformed, unknown type, wrong
    field types, unsupported protocol version."""

    error_code = "bad_request"


class LimitExceededError(EnvdError, RuntimeError):
    """The daemon refused a request that would exceed one of its limits
    (sessions, envs per client, message size)."""

    error_code = "limit_exceeded"


class UnknownSessionError(EnvdError, LookupError):
    """The daemon has no session with this id (closed, or never made)."""

    error_code = "unknown_session"


class SessionExpiredError(UnknownSessionError):
    """The daemon freed this session because its client went silent for longer
    than the lease timeout."""

    error_code = "session_expired"


class DaemonError(EnvdError, RuntimeError):
    """The daemon failed while serving a request (its log has the details)."""

    error_code = "internal"


class ShuttingDownError(EnvdError, ConnectionError):
    """The daemon is draining after SIGTERM/SIGINT and takes no new work."""

    error_code = "shutting_down"


class ConnectionLostError(EnvdError, ConnectionError):
    """No daemon answers at the endpoint, or the connection to it broke."""

    error_code = "connection_lost"


class NoDaemonError(ConnectionLostError):
    """No daemon was ever reached at the endpoint: nothing listens on its ipc
    socket, or nothing answered the first hello in time.  ``endpoint`` names
    the endpoint tried (the message says where it came from: an argument,
    ENVD_ENDPOINT or the default).  A ConnectionLostError too, so code that
    catches that keeps working.  Raised by the client; never sent on the wire."""

    error_code = "no_daemon"

    def __init__(self, message: str, endpoint: str = ""):
        super().__init__(message)
        self.endpoint = endpoint


class AuthenticationError(EnvdError, ConnectionError):
    """The CURVE handshake with a daemon's tcp endpoint failed: this client's
    public key is not in the daemon's --curve-allowed-clients directory, the
    server key is not the daemon's, or one side uses CURVE and the other does
    not.  Raised by the client; never sent on the wire."""

    error_code = "authentication"


class EnvdTimeoutError(EnvdError, TimeoutError):
    """A blocking call to the daemon got no reply within its timeout."""

    error_code = "timeout"


class SharedMemoryError(EnvdError, OSError):
    """The client cannot attach a session's shared-memory segment (the daemon
    runs on another host or in another IPC namespace, or the segment is gone)."""

    error_code = "shared_memory"


class UntrustedPathError(EnvdError, PermissionError):
    """The client refused a file another user could have planted or may
    change: the default socket folder (``$XDG_RUNTIME_DIR`` or
    ``/tmp/envd-$UID``) or a session's shared-memory segment owned by neither
    this process's user nor root, or writable by group or others.  Raised by
    the client; never sent on the wire."""

    error_code = "untrusted_path"


class UntrustedSegmentError(UntrustedPathError, SharedMemoryError):
    """A session's segment failed the ownership check (see
    UntrustedPathError); a SharedMemoryError too, so ``transport="auto"``
    sends the arrays over the socket instead, and ``"shm"`` raises it."""

    error_code = "untrusted_path"


class PluginError(EnvdError, ImportError):
    """A plugin library cannot be loaded: not found, no entry symbol, another
    ABI version, an invalid env definition or an env id already registered.
    Nothing of the plugin is registered."""

    error_code = "plugin"


__all__ = ["EnvdError", "UnknownEnvError", "InvalidArgumentError", "InvalidActionError",
           "EnvStateError", "NativeError", "ProtocolError", "LimitExceededError",
           "UnknownSessionError", "SessionExpiredError", "DaemonError", "ShuttingDownError",
           "ConnectionLostError", "AuthenticationError", "EnvdTimeoutError", "SharedMemoryError",
           "PluginError", "UntrustedPathError", "UntrustedSegmentError"]
