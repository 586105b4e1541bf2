"""The Stepper protocol: what a BatchedVecEnv steps through.

A ``BatchedVecEnv`` (envd.vector_base) checks what needs no state (shapes,
dtypes, action conversion, env-id range and repeats), writes a call's inputs
into its buffers, calls its stepper, and reads the outputs from the buffers
after it.  The stepper runs the envs and keeps the async books, once:

- in-process, ``envd.native.native_session.NativeSession`` (the native
  session: its books live in C);
- for a daemon-served env, the client's transports (shm over the socket,
  inline, doorbell), each of which asks the daemon's native session.

One stepper per env, called from one thread at a time, under the env's lock.
Inputs are in the env's buffers before each call: ``actions`` (every row for
``step``; the rows of ``env_ids`` for ``send``), ``reset_seeds`` and
``reset_mask``.  Errors are envd errors (envd.errors) with the messages of
envd.vec_errors (e.g. ``in_flight_error``), the same whichever stepper
raised them.

Async books (EnvPool's rules): each env is IDLE (the trainer holds it: it may
be sent), IN_FLIGHT (being stepped) or READY (stepped, waiting for recv).
Ready envs queue in the order their batches were found finished (batches
checked in submit order); the first failure of an env in a finished batch is
raised by the next recv, whose envs stay ready for the recv after it.
"""
from __future__ import annotations

from typing import NoReturn, Protocol, runtime_checkable

import numpy as np

from envd.errors import EnvStateError


@runtime_checkable
class Stepper(Protocol):
    """Runs the envs of one BatchedVecEnv and keeps its async books."""

    def reset(self, with_seeds: bool, with_mask: bool) -> None:
        """Reset every env (or those in reset_mask when with_mask), reseeding
        from reset_seeds first when with_seeds.  Refused while envs are in
        flight; forgets the ready ones (and a failure not reported yet)."""

    def async_reset(self, with_seeds: bool) -> None:
        """Wait for the envs in flight and drop their results, reset every
        env, and make them all READY in env order."""

    def step(self) -> int:
        """Step every env with the actions buffer; the number of episodes
        that ended.  Refused while envs are in flight or ready."""

    def send(self, env_ids: np.ndarray) -> None:
        """Start stepping env_ids (int64, each IDLE, no repeats) with their
        rows of the actions buffer; returns without waiting for them."""

    def recv(self, count: int) -> np.ndarray:
        """Block until count envs are ready and return exactly the count
        oldest ready ids (int64, ready order); the rest stay ready.  Refused
        when fewer than count are in flight or ready."""

    def render(self, out: np.ndarray) -> None:
        """Draw every env's frame into out ((num_envs, h, w, 3) uint8).
        Refused while envs are in flight or ready
        (not received: whether a sent env finished by now depends on the threads)."""

    def close(self) -> None:
        """Wait for what is in flight, free everything.  Idempotent."""


class _NoStepper:
    """The stepper of a VecEnv that has none: before its subclass set its
    own, and once closed (which drops it).  BatchedVecEnv._acquire() refuses
    a closed env before any call gets here, so the VecEnv's step, send and
    recv read a Stepper, never an Optional, at no cost per call."""

    def _refuse(self) -> NoReturn:
        raise EnvStateError("this VecEnv has no envs to step (closed, or its making failed)")

    def reset(self, with_seeds: bool, with_mask: bool) -> None:
        self._refuse()

    def async_reset(self, with_seeds: bool) -> None:
        self._refuse()

    def step(self) -> int:
        self._refuse()

    def send(self, env_ids: np.ndarray) -> None:
        self._refuse()

    def recv(self, count: int) -> np.ndarray:
        self._refuse()

    def render(self, out: np.ndarray) -> None:
        self._refuse()

    def close(self) -> None:
        """Nothing to free."""


#: the one _NoStepper
NO_STEPPER: Stepper = _NoStepper()
