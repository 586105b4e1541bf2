"""A session's life in the daemon: one state, every transition in one place.

```
             open()              begin(op)
   MAKING ----------> OPEN ------------------> BUSY
     |                 |   <------------------   |
     |                 |         end()           |
     | discard()       | close()                 | close()
     |                 v                         v
     |          batches in flight? ---yes---> CLOSING
     |                 | no                      | end() or settle(): the operation
     v                 v                         | ended, no batch in flight any more
   FREED <-------------+-------------------------+

  shut_down(): any state -> FREED (daemon shutdown; the free waits for what runs)
```

- MAKING: the make runs on the executor; nobody but the make knows the session.
- OPEN: in the books, idle: it takes the next request.
- BUSY: one operation runs (a reset or render on the executor, a sync step on
  the pool, a recv parked until enough envs finish); other requests are refused,
  except a send beside a parked recv (async over several daemons).
- CLOSING: closed, expired or dropped while an operation ran or async batches
  were in flight: out of the books (requests for it are answered as for a
  closed session), freed as soon as the operation ended and the batches
  settled (freeing would wait for a batch in flight and block the event loop).
- FREED: the envs are destroyed and the segment is removed; final.

Two facts stay apart from the state because they are orthogonal to it: whether
the session's doorbell (fast path) is served (``Session.fast_path``), and whether a
client truncated its segment (``Session.revoked``, read from the segment guard;
the Service closes such a session through close() like any other).

Illegal transitions raise LifecycleError: they are bugs in the daemon, never a
client's doing (a client's request for a busy or closed session is refused
before any transition is tried).
"""
from __future__ import annotations

import enum
from collections.abc import Callable
from typing import NoReturn


class State(enum.Enum):
    """Where a session is in its life (see the module docstring)."""

    MAKING = "making"
    OPEN = "open"
    BUSY = "busy"
    CLOSING = "closing"
    FREED = "freed"


class LifecycleError(RuntimeError):
    """A transition the lifecycle does not allow: a bug in the daemon."""


class Lifecycle:
    """One session's state and its transitions.

    ``free(orderly)`` destroys the session's envs and gives its resources back;
    the lifecycle calls it exactly once, on entering FREED (orderly False only
    at shutdown, when an operation may still run).  ``outstanding()`` says
    whether async batches are still in flight (a CLOSING session waits for
    them).  Owned by the event loop thread, like the session.
    """

    def __init__(self, name: str, free: Callable[[bool], None],
                 outstanding: Callable[[], bool]):
        self.name = name
        self.state = State.MAKING
        #: The running operation ("reset", "step", ...): set in BUSY, and in
        #: CLOSING while the operation that was running at the close ends.
        self.operation: str | None = None
        self._free = free
        self._outstanding = outstanding

    def __repr__(self) -> str:
        running = f", {self.operation} running" if self.operation else ""
        return f"<Lifecycle {self.name[:8]} {self.state.value}{running}>"

    # ---- what the handlers ask -------------------------------------------------------------
    @property
    def busy(self) -> bool:
        """An operation runs: the session takes no other request now."""
        return self.operation is not None

    @property
    def is_open(self) -> bool:
        """In the books: requests may reach it (OPEN or BUSY)."""
        return self.state in (State.OPEN, State.BUSY)

    @property
    def freed(self) -> bool:
        return self.state is State.FREED

    # ---- transitions -----------------------------------------------------------------------
    def open(self) -> None:
        """MAKING -> OPEN: the make's reply names the session."""
        self._expect("open", State.MAKING)
        self.state = State.OPEN

    def begin(self, operation: str) -> None:
        """OPEN -> BUSY: an operation starts that ends later (end())."""
        self._expect(f"begin {operation}", State.OPEN)
        self.state, self.operation = State.BUSY, operation

    def end(self) -> None:
        """BUSY -> OPEN, or CLOSING -> FREED once nothing is outstanding: the
        running operation ended (its reply is about to go out)."""
        self._expect("end", State.BUSY, State.CLOSING)
        if self.operation is None:
            raise LifecycleError(f"{self!r}: end without a running operation")
        self.operation = None
        if self.state is State.BUSY:
            self.state = State.OPEN
        else:
            self.settle()

    def close(self) -> None:
        """OPEN or BUSY -> CLOSING, or straight on to FREED when no operation
        runs and no batch is in flight (close, bye, lease expiry, truncated
        segment, dropped client)."""
        self._expect("close", State.OPEN, State.BUSY)
        self.state = State.CLOSING
        self.settle()

    def settle(self) -> None:
        """CLOSING -> FREED once the operation ended and the batches settled;
        otherwise nothing (it is called again when they have: the daemon's
        request engine waits for that, server/stepping.py settle_later).  A
        no-op in any other state."""
        if (self.state is State.CLOSING and self.operation is None
                and not self._outstanding()):
            self._enter_freed(orderly=True)

    def discard(self) -> None:
        """MAKING -> FREED: the make ended, but its reply is an error (the
        client left, the daemon drains, the segment was truncated)."""
        self._expect("discard", State.MAKING)
        self._enter_freed(orderly=True)

    def shut_down(self) -> None:
        """Any state -> FREED at daemon shutdown, once the executor stopped
        (freeing waits for a step or batch still on the pool).  Idempotent."""
        if self.state is not State.FREED:
            self.operation = None
            self._enter_freed(orderly=False)

    # ---- inside ----------------------------------------------------------------------------
    def _expect(self, transition: str, *allowed: State) -> None:
        if self.state not in allowed:
            raise LifecycleError(
                f"{self!r}: {transition} is only allowed from "
                f"{' or '.join(s.value for s in allowed)}")

    def _enter_freed(self, orderly: bool) -> None:
        self.state = State.FREED  # first: a free that raises must not run twice
        free, self._free, self._outstanding = self._free, _gone, _gone
        # (the callbacks refer to the session, which refers to this object: dropping
        # them breaks the cycle, so the session and its segment's mapping go as soon
        # as the daemon forgets it, not at the next garbage collection)
        free(orderly)


def _gone(*args: object) -> NoReturn:
    raise LifecycleError("a freed session's lifecycle was asked to free it again")
