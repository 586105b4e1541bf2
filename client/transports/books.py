"""The async books a daemon-served env keeps while its daemon's protocol
leaves them to the client.

Protocol 2's ``recv`` answers with every env found finished (not exactly the
count asked for), a daemon's ready list is empty after each recv, and no
message does an ``async_reset``; so the client remembers which envs are in
flight or ready, queues the surplus of a recv, and refuses a send of an env
that is not idle at once (as in-process).  These books exist once, here,
shared by every transport (envd.stepping gives their rules); RemoteVecEnv
keeps none.  They go when the daemon's native session answers recv with
exactly count ids and does async_reset itself (issue 16; docs/architecture.md).
"""
from __future__ import annotations

import collections

import numpy as np

from envd.errors import EnvdError, EnvStateError
from envd.vector_base import in_flight_error, not_idle_error, ready_error, recv_short_error

_IDLE, _IN_FLIGHT, _READY = 0, 1, 2


class AsyncBooks:
    """Each env IDLE, IN_FLIGHT or READY; ready ids in the order their
    batches were found finished; error: a failure (an env's in a finished
    batch, or a refused send) waiting for the next recv."""

    def __init__(self, env_id: str, num_envs: int):
        self.env_id = env_id
        self.num_envs = num_envs
        self._state = np.zeros(num_envs, np.int8)
        self._ready: collections.deque[np.ndarray] = collections.deque()
        self.num_ready = self.num_in_flight = 0
        self.error: EnvdError | None = None

    @property
    def active(self) -> bool:
        """Some envs are in flight or ready."""
        return bool(self.num_in_flight or self.num_ready)

    def check_idle(self, call: str) -> None:
        """reset and step act on every env: not while some are in flight (or,
        for step, ready); a reset forgets the ready ones and a failure of
        theirs not reported yet."""
        if self.num_in_flight:
            raise in_flight_error(self.env_id, call, self.num_in_flight)
        if self.num_ready and call == "step":
            raise ready_error(self.env_id, self.num_ready)
        self.forget()

    def forget(self) -> None:
        """Every env idle, no failure waiting."""
        self._ready.clear()
        self.num_ready = self.num_in_flight = 0
        self._state[:] = _IDLE
        self.error = None

    def check_sendable(self, env_ids: np.ndarray) -> None:
        busy = env_ids[self._state[env_ids] != _IDLE]
        if len(busy):
            raise not_idle_error(self.env_id, int(busy[0]), self._state[busy[0]] == _IN_FLIGHT)

    def check_recv(self, count: int) -> None:
        """Refuse a recv of count envs when fewer are in flight or ready (the
        failure waiting explains it better, when there is one)."""
        if self.num_ready + self.num_in_flight < count:
            if self.error is not None:
                raise self.take_error()
            raise recv_short_error(self.env_id, count, self.num_ready + self.num_in_flight)

    def sent(self, env_ids: np.ndarray) -> None:
        self._state[env_ids] = _IN_FLIGHT
        self.num_in_flight += len(env_ids)

    def refused(self, env_ids: np.ndarray, error: EnvdError) -> None:
        """A posted send the daemon refused: its envs were never stepped."""
        self._state[env_ids] = _IDLE
        self.num_in_flight -= len(env_ids)
        self.error = self.error or error

    def finished(self, env_ids: np.ndarray) -> None:
        self._state[env_ids] = _READY
        self._ready.append(env_ids)
        self.num_ready += len(env_ids)
        self.num_in_flight -= len(env_ids)

    def all_ready(self) -> None:
        """After an async reset: every env ready, in env order."""
        self.forget()
        self._ready.append(np.arange(self.num_envs, dtype=np.int64))
        self._state[:] = _READY
        self.num_ready = self.num_envs

    def take_error(self) -> EnvdError:
        error, self.error = self.error, None
        return error

    def pop(self, count: int) -> np.ndarray:
        """The count oldest ready ids (int64), idle from now on."""
        parts = []
        while count:
            head = self._ready[0]
            if len(head) <= count:
                parts.append(self._ready.popleft())
            else:
                parts.append(head[:count])
                self._ready[0] = head[count:]
            count -= len(parts[-1])
        ids = np.concatenate(parts) if len(parts) > 1 else parts[0]
        self.num_ready -= len(ids)
        self._state[ids] = _IDLE
        return ids

    def broken(self) -> EnvStateError:
        """What a recv raises when no batch finished though envs are counted
        in flight: the books are wrong; never spin on it."""
        return EnvStateError(f"{self.env_id}: {self.num_in_flight} envs counted in flight but "
                             "no send is running; close the env")
