"""The daemon's operation threads, shared fairly between its clients.

Makes, resets and renders run on a small executor (OPERATION_THREADS
threads) because they may take long: a make of a million envs, a hosted
env's make or reset (up to --hosted-timeout).  Without a rule, one client
posting a few slow makes held every thread and stalled every other client's
make, reset and render behind them.  So each client connection (routing id)

- runs at most ``per_client`` operations at once (--max-ops-per-client,
  default 1 of the 2 threads): the other threads stay for the others;
- waits in a queue of its own, at most ``max_queued`` long
  (--max-queued-ops, default 64); an operation beyond it is refused at once
  with limit_exceeded, before the request reserves or changes anything;
- is served round-robin with the other clients whose queue is not empty, so
  a client's turn comes however long the others' queues are.

A user who opens many connections is bounded by the connection limits
(--max-connections), as for every per-connection limit.  This covers the
operation threads only: the native pool's stepping (one client's 4096-env
steps against another's) is served chunk by chunk by the pool, with no
per-client quota (SECURITY.md, "What is not protected").  Everything here
runs on the event loop thread.
"""
from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from envd.errors import LimitExceededError

#: Threads of the daemon's executor (server/daemon.py), which FairOps fills.
OPERATION_THREADS = 2

log = logging.getLogger(__name__)

#: A finished operation's future: asyncio's (run_in_executor's, Service's
#: start) or concurrent.futures' (an operation failed before it started:
#: FairOps.cancel); done callbacks read only its result() and exception().
Done = Future[Any] | asyncio.Future[Any]

#: start(fn, finished): run fn on the executor, then finished(future) on the
#: event loop thread.
Start = Callable[[Callable[[], Any], Callable[[Done], None]], None]


class FairOps:
    """Per-client queues of operations, served round-robin onto the threads."""

    def __init__(self, start: Start, per_client: int, max_queued: int,
                 threads: int = OPERATION_THREADS):
        self._start = start
        self.per_client = per_client
        self.max_queued = max_queued
        self.threads = threads
        self.running = 0  # operations on the threads now
        self.refused = 0  # operations refused for a full queue, ever
        self._queues: dict[bytes, collections.deque] = {}  # clients with operations waiting
        self._order: collections.deque[bytes] = collections.deque()  # their round-robin turn
        self._running: collections.Counter[bytes] = collections.Counter()

    @property
    def queued(self) -> int:
        return sum(map(len, self._queues.values()))

    def check_room(self, owner: bytes) -> None:
        """LimitExceededError when owner's queue is full; call it before the
        request reserves or changes anything (submit never refuses)."""
        waiting = len(self._queues.get(owner, ()))
        if waiting >= self.max_queued:
            self.refused += 1
            raise LimitExceededError(
                f"this client has {waiting} makes, resets or renders waiting for the daemon's "
                f"operation threads (--max-queued-ops {self.max_queued}) and "
                f"{self._running.get(owner, 0)} running (--max-ops-per-client {self.per_client}); "
                "wait for their replies before sending more")

    def submit(self, owner: bytes, fn: Callable[[], Any],
               done: Callable[[Done], None]) -> None:
        """Queue fn for owner; done(future) runs on the event loop thread once
        it ran on an operation thread."""
        queue = self._queues.get(owner)
        if queue is None:
            queue = self._queues[owner] = collections.deque()
            self._order.append(owner)
        queue.append((fn, done))
        self._dispatch()

    def cancel(self, owner: bytes, error: BaseException) -> int:
        """Fail owner's waiting operations with error, each done(future) run
        now (so their reservations are released and each request answered
        once): a client that left (bye, lease expired, dropped) must not keep
        its queue running for nobody, holding --max-sessions with makes no
        one reads.  Its running operations finish as they are.  Returns how
        many were failed."""
        queue = self._queues.pop(owner, None)
        if not queue:
            return 0
        self._order.remove(owner)  # (a client with a queue is always in the line)
        for _, done in queue:
            future: Future = Future()
            future.set_exception(error)
            try:
                done(future)
            except Exception:  # a bug in one done must not skip the others
                log.exception("internal error while failing a departed client's operation")
        return len(queue)

    def owners(self) -> set[bytes]:
        """The clients with operations running or waiting."""
        return {*self._queues, *self._running}

    def waiting(self, owner: bytes) -> tuple[int, int]:
        """(running, queued) operations of owner."""
        return self._running.get(owner, 0), len(self._queues.get(owner, ()))

    def _dispatch(self) -> None:
        """Start queued operations while threads are free, taking clients in
        turn and skipping those at their share."""
        while self.running < self.threads:
            picked = self._next()
            if picked is None:
                return
            owner, (fn, done) = picked
            self.running += 1
            self._running[owner] += 1
            self._start(fn, self._finisher(owner, done))

    def _next(self) -> tuple[bytes, tuple] | None:
        for _ in range(len(self._order)):
            owner = self._order.popleft()
            queue = self._queues[owner]
            if self._running.get(owner, 0) >= self.per_client:
                self._order.append(owner)  # its turn passes
                continue
            item = queue.popleft()
            if queue:
                self._order.append(owner)  # to the back of the line
            else:
                del self._queues[owner]
            return owner, item
        return None

    def _finisher(self, owner: bytes, done: Callable[[Done], None]) -> Callable[[Done], None]:
        def finished(future: Done) -> None:
            self.running -= 1
            self._running[owner] -= 1
            if not self._running[owner]:
                del self._running[owner]
            try:
                done(future)
            finally:
                self._dispatch()
        return finished
