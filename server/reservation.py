"""Limit accounting of a make: every check in one place, released exactly once.

A make runs on the executor, so what it will hold (a session slot, the
client's sessions and envs, the segment's bytes, the env state's bytes, file
descriptors) must count against the limits from the moment it is accepted,
or two makes in flight would both pass checks that only one fits under.
``ResourceBooks.reserve`` makes every check and returns a ``Reservation`` that
holds those amounts; the make's completion releases it exactly once, either
turning the made session's bytes into bytes in use (``claim``) or giving
everything back (``release``, also what leaving a ``with`` block by an
exception does).  ``give_back`` returns a freed session's bytes, once.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from gymnasium.vector import AutoresetMode

from envd.errors import LimitExceededError
from envd.native.registry import EnvSpec
from envd.server.config import Config
from envd.server.hosted import HostedEnvSpec, hosted_state_plan, public_plan
from envd.server.sessions import ClientRecord, segment_plan, state_plan

if TYPE_CHECKING:
    from envd.server.sessions import Session


class ResourceBooks:
    """What the daemon's sessions hold until they are freed, and what the
    makes in flight reserved.  Owned by the event loop thread."""

    def __init__(self, config: Config):
        self.config = config
        self.reserved_sessions = 0  # makes in flight
        self.reserved_shm = 0       # bytes of the segments of makes in flight
        self.reserved_state = 0     # heap bytes (state_plan) of makes in flight
        self.shm_in_use = 0         # bytes of the segments of sessions not freed yet
        self.state_in_use = 0       # heap bytes of sessions not freed yet
        self.reserved_workers = 0   # worker processes of hosted makes in flight
        self.workers_in_use = 0     # worker processes of hosted sessions not freed yet
        #: Workers of freed sessions not exited yet (Service sets it to its
        #: reaper's count): they still count against --max-workers.
        self.reaping: Callable[[], int] = lambda: 0
        self._held: set[Session] = set()  # sessions whose bytes count as in use

    @property
    def shm_bytes(self) -> int:
        """Bytes of shared memory the sessions hold, makes in flight included."""
        return self.shm_in_use + self.reserved_shm

    @property
    def state_bytes(self) -> int:
        """Heap bytes the sessions' env state holds at most, makes in flight included."""
        return self.state_in_use + self.reserved_state

    def reserve(self, client: ClientRecord, spec: EnvSpec | HostedEnvSpec, num_envs: int,
                mode: AutoresetMode, open_sessions: int,
                fd_check: Callable[[int, int, int], None] | None = None,
                num_workers: int = 0, info_bytes: int = 0) -> Reservation:
        """Check that a make of num_envs envs of spec fits under every limit
        (open_sessions: sessions in the books now) and reserve what it will
        hold; raises LimitExceededError naming the limit and the flag."""
        config = self.config
        if open_sessions + self.reserved_sessions >= config.max_sessions:
            raise LimitExceededError(
                f"the daemon holds its maximum of {config.max_sessions} sessions "
                "(--max-sessions); close envs you no longer use")
        held_sessions = len(client.sessions) + client.reserved_sessions
        if held_sessions >= config.max_sessions_per_client:
            raise LimitExceededError(
                f"this client holds {held_sessions} sessions, the daemon's maximum of "
                f"{config.max_sessions_per_client} sessions per client "
                "(--max-sessions-per-client); close envs you no longer use")
        held = client.num_envs + client.reserved_envs
        if held + num_envs > config.max_envs_per_client:
            raise LimitExceededError(
                f"making {num_envs} more envs would give this client {held + num_envs}, over "
                f"the daemon's limit of {config.max_envs_per_client} envs per client "
                "(--max-envs-per-client)")
        workers = self.workers
        if num_workers and workers + num_workers > config.max_workers:
            raise LimitExceededError(
                f"making {num_envs} {spec.id} envs in {num_workers} worker processes would "
                f"give the daemon {workers + num_workers}, over its limit of "
                f"{config.max_workers} (--max-workers); close hosted envs you no longer use "
                "or ask for fewer workers (num_workers)")
        if isinstance(spec, HostedEnvSpec):  # a hosted Python env (server/hosted.py)
            segment_bytes = public_plan(spec, num_envs, mode, info_bytes)[1]
        else:
            segment_bytes = segment_plan(spec, num_envs, mode)[1]  # refused before it exists
        in_use = self.shm_bytes
        if in_use + segment_bytes > config.max_shm_bytes:
            raise LimitExceededError(
                f"making {num_envs} {spec.id} envs needs a shared-memory segment of "
                f"{segment_bytes} bytes; with the {in_use} bytes the daemon's sessions hold "
                f"that is {in_use + segment_bytes}, over its limit of "
                f"{config.max_shm_bytes} bytes (--max-shm-bytes); close envs you no "
                "longer use or make fewer")
        if isinstance(spec, HostedEnvSpec):
            state_bytes = hosted_state_plan(spec, num_envs, num_workers, mode, info_bytes)
            what = "bytes of env state (its workers' private segment, plus per-env bookkeeping)"
        else:
            state_bytes = state_plan(spec, num_envs)  # refused before anything is allocated
            heap = getattr(spec, "heap_bytes", 0)
            own = f", and up to {heap} bytes its own code allocates per env" if heap else ""
            what = (f"bytes of env state (state_size {spec.definition.state_size} bytes per "
                    f"env, plus per-env bookkeeping{own})")
        in_use = self.state_bytes
        if in_use + state_bytes > config.max_state_bytes:
            over = in_use + state_bytes - config.max_state_bytes
            raise LimitExceededError(
                f"making {num_envs} {spec.id} envs needs {state_bytes} {what}; "
                f"with the {in_use} bytes the daemon's sessions hold that is "
                f"{in_use + state_bytes}, {over} bytes over its limit of "
                f"{config.max_state_bytes} bytes (--max-state-bytes); close envs you no "
                "longer use or make fewer")
        if fd_check is not None:  # the session's fds must not eat the daemon's reserve
            fd_check(self.reserved_sessions, self.reserved_workers, num_workers)
        return Reservation(self, client, num_envs, segment_bytes, state_bytes, num_workers)

    @property
    def workers(self) -> int:
        """Worker processes alive or to be: those of the hosted sessions, of
        the hosted makes in flight, and of freed sessions not reaped yet."""
        return self.workers_in_use + self.reserved_workers + self.reaping()

    def give_back(self, session: Session) -> None:
        """A freed session's bytes no longer count (once; nothing if its make
        never claimed them)."""
        if session in self._held:
            self._held.discard(session)
            self.shm_in_use -= session.segment_bytes
            self.state_in_use -= session.state_bytes
            self.workers_in_use -= getattr(session, "num_workers", 0)

    def _hold(self, session: Session) -> None:
        if session not in self._held:
            self._held.add(session)
            self.shm_in_use += session.segment_bytes
            self.state_in_use += session.state_bytes
            self.workers_in_use += getattr(session, "num_workers", 0)


class Reservation:
    """What one accepted make holds until its session exists or it failed.
    Made by ResourceBooks.reserve; ends exactly once, by claim or release."""

    def __init__(self, books: ResourceBooks, client: ClientRecord, num_envs: int,
                 segment_bytes: int, state_bytes: int, num_workers: int = 0):
        self.books, self.client = books, client
        self.num_envs = num_envs
        self.segment_bytes, self.state_bytes = segment_bytes, state_bytes
        self.num_workers = num_workers
        self.released = False
        books.reserved_workers += num_workers
        books.reserved_sessions += 1
        books.reserved_shm += segment_bytes
        books.reserved_state += state_bytes
        client.reserved_sessions += 1
        client.reserved_envs += num_envs

    def release(self) -> None:
        """Give everything reserved back.  A second call is a bug: it raises."""
        if self.released:
            raise RuntimeError("a make's reservation was released twice")
        self.released = True
        books, client = self.books, self.client
        books.reserved_sessions -= 1
        books.reserved_shm -= self.segment_bytes
        books.reserved_state -= self.state_bytes
        books.reserved_workers -= self.num_workers
        client.reserved_sessions -= 1
        client.reserved_envs -= self.num_envs

    def claim(self, session: Session) -> None:
        """The make succeeded: release the reservation and count the
        session's bytes as in use until ResourceBooks.give_back."""
        self.release()
        self.books._hold(session)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        if not self.released:  # an exception left the block before claim
            self.release()
