"""The one exception hierarchy of envd.

Every error envd raises on purpose is an ``EnvdError``.  Subclasses also derive
from the matching builtin (``ValueError``, ``RuntimeError``...) so code written
against gymnasium's conventions keeps catching them.
"""
from __future__ import annotations


class EnvdError(Exception):
    """Base class of every error raised by envd."""


class UnknownEnvError(EnvdError, ValueError):
    """No env is registered under the requested id."""


class InvalidArgumentError(EnvdError, ValueError):
    """A call got an argument it cannot accept (num_envs, seeds, kwargs, modes...)."""


class InvalidActionError(EnvdError, ValueError):
    """Actions of the wrong shape or dtype, or a discrete action out of range."""


class EnvStateError(EnvdError, RuntimeError):
    """The call is not valid in the env's current state (closed, not reset, done)."""


class NativeError(EnvdError, RuntimeError):
    """The native core failed unexpectedly; ``code`` is its ENVD_E* error code."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


__all__ = ["EnvdError", "UnknownEnvError", "InvalidArgumentError", "InvalidActionError",
           "EnvStateError", "NativeError"]
