"""The one stepper of a MultiVecEnv (several daemons used as one), sync or
async mode (made with batch_size < num_envs: ``envd.connect([ep1,
ep2]).make(id, N, batch_size=B)``), over each shard's transport.

A sync step (either mode's ``step``) posts a step on every shard
(``post_step``, after writing its rows of the actions into its buffers),
then waits for each in turn on the calling thread (the transport's own
wait: the zmq poll of the socket, the doorbell's spin and sleep): the
daemons step at once, and no other thread touches a shard.  The shards that
stepped have their outputs copied into the MultiVecEnv's rows; the first
error in env order is raised, named after its daemon, once every shard's
step returned; an interrupt (KeyboardInterrupt) is raised at once, every
shard posted whose answer can still come marked as may still be running,
as one that timed out (the next call waits for those answers first, one
client timeout for all).  While some shard may still be running, a step,
send or reset is refused before anything is written to or posted on any
shard (a refused step moves no shard).  A reset goes to every shard through the
MultiVecEnv's ``dispatch`` (a reset has no non-blocking half).  The rest of
this docstring is async mode's.

Global env i lives on shard k (a RemoteVecEnv on daemon k holding the
consecutive envs ``shard_slices[k]``) as its local env ``i - start_k``.  Each
daemon's native session keeps the books of its own envs; the order in which
envs of *different* daemons finished exists only here, so this stepper keeps
the books across them, EnvPool's rules unchanged (envd.stepping).  It
drives each shard through its transport's public non-blocking half only
(envd.stepping.PostingStepper: post a send or a recv, get a ticket, poll,
the waitables), over any transport (shm or inline over the socket, the
doorbell: client/transports/), and keeps no wire of its own:

- every env is IDLE, IN_FLIGHT or READY (one int8 per env);
- ``send(ids)`` posts each shard its part (``post_send``, after writing the
  action rows into that shard's buffers): the daemons step their parts at
  once, in parallel, and the trainer does not wait;
- while a daemon has envs in flight, exactly one recv ticket is out there
  (``post_recv``: answered once a batch finished, with at least one env).
  The envs a done recv ticket names are appended to one FIFO (as one entry:
  its shard and ids), in the order the tickets were taken in (within one,
  the daemon's ready order).  Their rows stay in the shard's buffers:
  nothing writes them until the env is sent again;
- ``recv(count)`` returns the oldest count ids of that FIFO: exactly count,
  each env once.  While fewer are ready it waits on every daemon with envs
  in flight at once (client/transports/waiting.py: one zmq.Poller over the
  sockets, or spinning and sleeping on the doorbells where every shard has
  the fast path).  A batch of one shard's envs (EnvPool's loop with a
  batch per daemon) is gathered
  straight from that shard's buffers (``batch_source``: one copy); a batch
  across shards first has its rows copied into the MultiVecEnv's buffers.
  Those buffers are therefore behind the shards' after a recv, and are
  brought up to date before a reset or step reads them (``_sync_buffers``).

Per env, the books keep one state byte; a batch whose ids are one run of
consecutive envs (in any order: a send's ids are unique, so min and max
tell) updates them with one slice, not per id.

A multi-agent env (agents as rows) works in whole envs, as on one daemon:
the books, the FIFO and every id a shard sends or receives name envs; only
the copies between the shards' buffers and the MultiVecEnv's, and a recv's
gather from a shard's buffers, move each env's num_agents rows
(agent-major: env i's rows are i*A .. i*A+A-1).

Refusals keep the one-daemon rules: a send of an env not idle raises at the
send (the books are here); a send the daemon refuses (a done env in
``disabled`` mode) is raised by the next call (by the send itself where a
transport answers it at once), naming the daemon, and its envs are idle
again; a recv of more than are in flight or ready raises at
once; an env failing in a batch makes the next recv raise and the one after
it return the batch's envs.

A daemon that dies while envs are out makes the call that notices (at the
latest the recv waiting on it) raise ConnectionLostError naming its endpoint
and envs; the MultiVecEnv then refuses every call.  The other daemons'
sessions are left open, their batches in flight stepping to the end, until
``close()``, which closes them (their results are dropped) and is still
needed, as after a lost daemon in sync mode.
"""
from __future__ import annotations

import bisect
import collections
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NoReturn

import numpy as np

from envd.client.transports.waiting import waiter_for
from envd.errors import (
    ConnectionLostError,
    EnvdError,
    EnvdTimeoutError,
    EnvStateError,
    ProtocolError,
)
from envd.stepping import PostingStepper, Ticket
from envd.vec_errors import in_flight_error, not_idle_error, ready_error, recv_short_error
from envd.vec_rows import RepeatCheck, run_of

IDLE, IN_FLIGHT, READY = 0, 1, 2
#: longest single wait: a lost daemon's monitor event wakes the wait anyway;
#: this bounds how late a timeout is noticed
_POLL_SLICE_S = 1.0


def _run_of(low: int, high: int, count: int) -> slice | None:
    """slice(low, high + 1) when count unique ids from low to high fill it."""
    return slice(low, high + 1) if high - low + 1 == count else None


def _span(ids: np.ndarray, positions: np.ndarray) -> tuple[int, int, bool]:
    """(min, max, in order) of ids (int64, non-empty): the ends of a run of
    consecutive ids in increasing order (the common case: a memcmp, run_of;
    in order True), else two passes (False)."""
    run = run_of(ids, positions)
    if run is not None:
        return run.start, run.stop - 1, True
    return int(ids.min()), int(ids.max()), False


class LostDaemon:
    """Which daemon of a MultiVecEnv is gone (its shard's index and the
    error that said so), once one is; the first loss counts.  Shared by the
    env and its stepper, which reads it on every call (an attribute, not a
    call on the env)."""

    __slots__ = ("error", "shard")

    def __init__(self) -> None:
        self.shard = -1
        self.error: BaseException | None = None

    def record(self, shard: int, error: BaseException) -> None:
        if self.error is None:
            self.shard, self.error = shard, error


@dataclass(frozen=True)
class ShardPart:
    """What the stepper is given of one daemon's part: its transport's
    stepper, the buffers it steps in, the consecutive envs it holds (global
    ids) and its daemon's endpoint."""

    stepper: PostingStepper
    buffers: dict[str, np.ndarray]
    rows: slice
    endpoint: str
    #: its client's timeout now (a Client's may change after make; the
    #: longest decides how long a call waits in all)
    timeout: Callable[[], float]


@dataclass(frozen=True)
class ShardsHost:
    """What the stepper is given of its MultiVecEnv (handed over at make,
    holding the env weakly: client/multi.py): its buffers (num_envs *
    num_agents rows), the output buffers' names, and the calls it makes
    on the env."""

    env_id: str
    num_agents: int
    buffers: dict[str, np.ndarray]
    outputs: tuple[str, ...]
    #: the sync reset of every shard (MultiVecEnv's)
    run_reset: Callable[[bool, bool], None]
    #: refuse a sync step as the single env would (a lost daemon, an env
    #: never reset, an action out of range), before any shard steps
    check_step: Callable[[], None]
    #: the episodes that ended in the env's buffers (a sync step's result)
    count_done: Callable[[], int]
    #: shard k's outputs into the env's rows
    copy_results: Callable[[int], None]
    #: call(k) for every shard k given at once, raising the first error named
    dispatch: Callable[[Callable[[int], None], Sequence[int]], None]
    #: every env was reset (an async reset's)
    mark_all_started: Callable[[], None]
    #: the env's record of a lost daemon; raise (naming it) if there is
    #: one; record shard k's daemon lost
    lost: LostDaemon
    check_not_lost: Callable[[], None]
    mark_lost: Callable[[int, BaseException], None]
    #: name an error after shard k's daemon and envs (client/multi.py _naming)
    named: Callable[[BaseException, int], BaseException]
    #: the refusal of an async call (named) by an env made without async mode
    no_async: Callable[[str], EnvStateError]


class _Shard:
    """One daemon's part of the books (``index``: its place among the
    shards): its envs in flight (sent, not yet received back), the recv
    ticket out there, and its send tickets not answered yet (with their
    global ids)."""

    def __init__(self, index: int, part: ShardPart, agents: int):
        self.index = index
        self.stepper = part.stepper
        self.buffers = part.buffers
        self.rows = part.rows
        #: its rows in the env's buffers (agents x envs)
        self.row_span = slice(part.rows.start * agents, part.rows.stop * agents)
        self.endpoint = part.endpoint
        self.timeout = part.timeout
        self.in_flight = 0
        self.recv: Ticket | None = None
        self.sends: list[tuple[Ticket, np.ndarray]] = []

    @property
    def where(self) -> str:
        return f"the daemon at {self.endpoint}, serving envs {self.rows.start}..{self.rows.stop - 1}"

    def rows_of(self, local: np.ndarray) -> np.ndarray:
        """The buffer rows of its envs local (agent-major)."""
        return self.stepper.rows_of(local)


class ShardsStepper:
    """The envd.stepping.Stepper of a MultiVecEnv (see the module
    docstring), over the shards' PostingSteppers; is_async: made with
    batch_size < num_envs (else async calls are refused)."""

    def __init__(self, host: ShardsHost, parts: Sequence[ShardPart], is_async: bool):
        self._host = host
        self._async = is_async
        self._lost_daemon = host.lost
        self._env_id = host.env_id
        self._shards = [_Shard(k, part, host.num_agents) for k, part in enumerate(parts)]
        num_envs = self._shards[-1].rows.stop
        self._starts = np.array([shard.rows.start for shard in self._shards], np.int64)
        self._start_list = self._starts.tolist()  # (bisect: a send's owner in O(log k))
        self._agents = host.num_agents  # rows per env
        self._state = np.zeros(num_envs, np.int8)  # per env, not per row
        self._all_in_flight = bytes([IN_FLIGHT]) * len(self._state)  # (_check_answered_ids)
        self._repeat_check = RepeatCheck(num_envs)  # (_check_answered_ids)
        self._positions = self._repeat_check.positions  # 0, 1, 2, ... (_span, run_of)
        #: the FIFO of ready envs: (shard index, their ids there, global ids,
        #: the slice of global ids they fill or None), one entry per ticket
        self._ready: collections.deque[tuple[int, np.ndarray, np.ndarray, slice | None]] = \
            collections.deque()
        self._num_ready = 0
        #: the last recv's batch: (shard index, its rows in that shard's
        #: buffers) when all its envs are one shard's, else None (its rows
        #: were copied into the env's buffers); MultiVecEnv._gather reads it
        self.batch_source: tuple[int, np.ndarray] | None = None
        #: a recv left the env's buffers behind the shards' (_sync_buffers)
        self._behind = False
        #: the first refusal of a posted send, read but not raised yet
        self._refusal: BaseException | None = None
        #: the first env failure a recv ticket reported, raised by the next recv
        self._failure: BaseException | None = None
        #: a send or recv timed out: which envs are in flight is unknown
        self._async_lost = False
        self._waiter = waiter_for([shard.stepper for shard in self._shards])

    # ---- the Stepper protocol ------------------------------------------------------------
    def reset(self, with_seeds: bool, with_mask: bool) -> None:
        self._start_call()
        in_flight = self._in_flight()
        if in_flight:
            raise in_flight_error(self._env_id, "reset", in_flight)
        self._check_shards_free()  # (a refused reset resets no shard)
        self._forget()  # (the ready ones, a refusal, a failure: as one daemon)
        self._sync_buffers()  # (a masked reset returns the other envs' rows as they are)
        self._host.run_reset(with_seeds, with_mask)

    def async_reset(self, with_seeds: bool) -> None:
        """Every shard's async reset at once, then all envs READY in env order."""
        if not self._async:
            raise self._host.no_async("async_reset")
        self._start_call()
        self._check_shards_free()  # (a refused reset resets no shard)
        # a daemon refuses a reset while a recv of the session waits: let
        # those recvs be answered (their envs are dropped with the rest)
        deadline = time.monotonic() + self._timeout()
        while self._waiting_anywhere():
            self._wait(deadline, "async_reset")
        self._forget()
        seeds = self._host.buffers["reset_seeds"]
        received: list[np.ndarray | None] = [None] * len(self._shards)

        def reset_shard(k: int) -> None:
            shard = self._shards[k]
            count = shard.rows.stop - shard.rows.start
            if with_seeds:  # (one seed per env: the first count entries)
                shard.buffers["reset_seeds"][:count] = seeds[shard.rows]
            # the daemon waits for the batches in flight and drops them
            shard.stepper.async_reset(with_seeds)
            # every earlier request's answer came before this one's (a daemon
            # answers a send at once, and no recv waits there now): a refused
            # send read later must not make envs idle that are ready now
            shard.sends.clear()
            shard.recv = None
            shard.in_flight = 0
            received[k] = shard.stepper.recv(count)  # all of them, in env order

        self._host.dispatch(reset_shard, range(len(self._shards)))
        self._host.mark_all_started()  # (a sync step once all are received: as after reset())
        for shard, local in zip(self._shards, received):  # (env order: shard by shard)
            assert local is not None  # (dispatch ran reset_shard for every shard)
            self._add_ready(shard, local, None)  # (idle after _forget: marked per id)
        # every row of the env's own buffers a fresh episode's, as the
        # shards' (and as one env's after async_reset: reward 0, no flags)
        self._sync_buffers()

    def step(self) -> int:
        if self._async:
            self._start_call()
            self._raise_refusal()
            in_flight = self._in_flight()
            if in_flight:
                raise in_flight_error(self._env_id, "step", in_flight)
            if self._num_ready:
                raise ready_error(self._env_id, self._num_ready)
        self._check_shards_free()  # (before anything is written: a refused step moves nothing)
        self._sync_buffers()  # (the step's checks read the envs' last flags there)
        self._host.check_step()
        return self._step_shards()

    def send(self, env_ids: np.ndarray) -> None:
        if not self._async:
            raise self._host.no_async("send")
        self._start_call()
        self._check_shards_free()  # (after a sync step that timed out or was interrupted)
        self._check_async_state()
        self._raise_refusal()
        low, high, _ = _span(env_ids, self._positions)
        # (the ids are unique: BatchedVecEnv checked them, or they are the
        # last recv's, each once: _check_answered_ids)
        run = _run_of(low, high, len(env_ids))
        if (self._state[run] if run is not None else self._state[env_ids]).any():
            states = self._state[env_ids]
            k = int(np.flatnonzero(states)[0])
            raise not_idle_error(self._env_id, int(env_ids[k]), states[k] == IN_FLIGHT)
        first = bisect.bisect_right(self._start_list, low) - 1
        if first == bisect.bisect_right(self._start_list, high) - 1:
            # (the common case: one daemon's envs, as recv returned them)
            touched, parts = [first], [(env_ids, run)]
        else:
            owners = np.searchsorted(self._starts, env_ids, side="right") - 1
            touched = [int(k) for k in
                       np.flatnonzero(np.bincount(owners, minlength=len(self._shards)))]
            parts = [(env_ids[owners == k], None) for k in touched]
        for k, (part, part_run) in zip(touched, parts):
            self._post_send(k, part, part_run)
        for k in touched:
            shard = self._shards[k]
            if shard.recv is None and shard.in_flight:
                self._post_recv(shard)

    def recv(self, count: int) -> np.ndarray:
        if not self._async:
            raise self._host.no_async("recv")
        self._start_call()
        self._check_async_state()
        self._raise_refusal()
        self._raise_failure()
        deadline = time.monotonic() + self._timeout()
        while self._num_ready < count:
            if self._num_ready + self._in_flight() < count:
                self._raise_refusal()  # too few out because a send was refused: say why
                raise recv_short_error(self._env_id, count, self._num_ready + self._in_flight())
            self._wait(deadline, "recv")
            self._raise_failure()
        return self._pop_ready(count)

    def render(self, out: np.ndarray) -> None:
        raise EnvStateError("a MultiVecEnv does not render: make the env to record on one daemon")

    def close(self) -> None:
        """Let go of the shards (the env closes them; each daemon answers a
        recv still waiting once a batch of the closed session finishes, and
        its reply is read as a late one).  Idempotent."""
        self._forget()
        self._waiter.close()
        self._shards = []  # (their segments' mappings go with the shards)

    # ---- the sync step ------------------------------------------------------------------------
    def _step_shards(self) -> int:
        """Post a step on every shard (its rows of the actions written into
        its buffers first), then wait for each in turn, on this thread:
        the daemons step at once while the first is waited for.  The waits
        share one deadline, the Client timeout from the first: daemons that
        all hang cost one timeout, not one each.  Each shard that stepped
        has its outputs copied into the env's rows; the first error in env
        order is raised, named after its daemon, once every shard's step
        returned (a daemon gone is recorded: the env refuses every later
        call).  A step is refused before any shard is written to or posted
        while some shard's daemon may still be stepping (step() checks it:
        _check_shards_free): a refused step moves no shard.  An interrupt (KeyboardInterrupt,
        not an Exception) is raised at once, every shard posted whose answer
        may still come given up on (its stepper's give_up: maybe_running),
        and the env's rows marked behind the shards' (a copy it cut short, a
        late answer): the next step or reset waits for the late answers
        (check_buffers_free), refuses while one may still come, and copies
        every shard's rows in before it reads them (_sync_buffers)."""
        actions = self._host.buffers["actions"]
        posted: list[Ticket | Exception] = []
        waiting = 0  # (the first shard not waited for yet)
        failed: tuple[_Shard, BaseException] | None = None
        try:
            for shard in self._shards:
                try:
                    shard.buffers["actions"][...] = actions[shard.row_span]
                    posted.append(shard.stepper.post_step())
                except Exception as exc:  # noqa: BLE001 -- raised once every shard returned
                    posted.append(exc)
            deadline = time.monotonic() + self._timeout()
            for shard, ticket in zip(self._shards, posted):
                error: BaseException | None
                if isinstance(ticket, Ticket):
                    try:
                        shard.stepper.wait(ticket, deadline)
                    except Exception as exc:  # noqa: BLE001 -- as above
                        error = exc
                    else:
                        error = ticket.error
                    if error is None:
                        self._host.copy_results(shard.index)
                        waiting += 1
                        continue
                else:
                    error = ticket
                waiting += 1
                if isinstance(error, ConnectionLostError):
                    self._host.mark_lost(shard.index, error)
                if failed is None:
                    failed = (shard, error)
        except BaseException as exc:
            self._behind = True
            for shard, ticket in zip(self._shards[waiting:], posted[waiting:]):
                if isinstance(ticket, Ticket):
                    shard.stepper.give_up(ticket, exc)  # (until its late answer came)
            raise
        if failed is not None:
            self._raise_named(*failed)
        return self._host.count_done()

    def _check_shards_free(self) -> None:
        """Refuse a step or reset, before anything is written to or posted
        on any shard, while some shard's daemon may still use its buffers (a
        step there timed out or was interrupted and its late answer has not
        come: check_buffers_free takes it in if it came).  Every shard's
        late answer is taken in first; the first refusal in env order is
        raised, named after its daemon."""
        failed: tuple[_Shard, BaseException] | None = None
        deadline: float | None = None  # (one wait for all: the late answers come at once)
        for shard in self._shards:
            if not shard.stepper.maybe_running:
                continue
            if deadline is None:
                deadline = time.monotonic() + self._timeout()
            try:
                shard.stepper.check_buffers_free(deadline)
            except Exception as exc:  # noqa: BLE001 -- the first is raised below
                if isinstance(exc, ConnectionLostError):
                    self._host.mark_lost(shard.index, exc)
                if failed is None:
                    failed = (shard, exc)
        if failed is not None:
            self._raise_named(*failed)

    def _raise_named(self, shard: _Shard, error: BaseException) -> NoReturn:
        named = self._named(error, shard)
        if named is error:
            raise error
        raise named from error

    # ---- books ----------------------------------------------------------------------------
    def _timeout(self) -> float:
        """How long a call may wait in all: the longest of the shards'
        clients' timeouts now."""
        return max([shard.timeout() for shard in self._shards])

    def _in_flight(self) -> int:
        return sum(shard.in_flight for shard in self._shards)

    def _forget(self) -> None:
        self._ready.clear()
        self._num_ready = 0
        self._state[:] = IDLE
        self._refusal = self._failure = None

    def _add_ready(self, shard: _Shard, local: np.ndarray, run: slice | None) -> None:
        """Envs local of the shard (in range, each once) finished: READY, at
        the FIFO's end (their rows are in the shard's buffers, so the env's
        are behind now).  run: the slice of global ids they fill, if they do
        (a daemon's answer: _check_answered_ids refused one naming an env
        not in flight, so the run holds these envs only)."""
        ids = local + shard.rows.start  # (in local's order: a run's may be any)
        self._state[run if run is not None else ids] = READY
        self._ready.append((shard.index, local, ids, run))
        self._num_ready += len(ids)
        self._behind = True

    def _pop_ready(self, count: int) -> np.ndarray:
        """The oldest count ready ids (int64, ready order); they are IDLE now.
        Sets batch_source: where their rows are gathered from."""
        parts, taken = [], 0
        while taken < count:
            k, local, ids, run = self._ready.popleft()
            if taken + len(ids) > count:
                cut = count - taken
                self._ready.appendleft((k, local[cut:], ids[cut:], None))
                local, ids, run = local[:cut], ids[:cut], None
            parts.append((k, local, ids))
            self._state[run if run is not None else ids] = IDLE
            taken += len(ids)
        self._num_ready -= count
        shard = self._shards[parts[0][0]]
        if all(k == shard.index for k, _, _ in parts):  # (one shard's: gathered from there)
            local = parts[0][1] if len(parts) == 1 else np.concatenate([p[1] for p in parts])
            self.batch_source = (shard.index, shard.rows_of(local))
        else:
            for k, local, _ in parts:
                self._copy_rows(self._shards[k], local)
            self.batch_source = None
        return parts[0][2] if len(parts) == 1 else np.concatenate([p[2] for p in parts])

    def _sync_buffers(self) -> None:
        """Bring the env's buffers up to its shards' (a recv gathered from a
        shard's buffers leaves them behind) before a reset or step reads them."""
        if self._behind:
            for k in range(len(self._shards)):
                self._host.copy_results(k)
            self._behind = False

    def _copy_rows(self, shard: _Shard, local: np.ndarray) -> None:
        """The shard's output rows of its envs local into the env's buffers
        (for a batch across shards; one block copy when they are consecutive
        and ascending: fancy indexing costs more).  Env j of the shard is
        rows j*A .. j*A+A-1 there and (start+j)*A .. here."""
        buffers, theirs = self._host.buffers, shard.buffers
        first, count, agents = int(local[0]), len(local), self._agents
        offset = shard.rows.start * agents
        if int(local[-1]) - first + 1 == count and (count < 2 or (np.diff(local) == 1).all()):
            rows = slice(first * agents, (first + count) * agents)
            at = slice(rows.start + offset, rows.stop + offset)
            for name in self._host.outputs:
                buffers[name][at] = theirs[name][rows]
            return
        row_ids = shard.rows_of(local)
        for name in self._host.outputs:
            buffers[name][row_ids + offset] = theirs[name][row_ids]

    def _copy_actions(self, shard: _Shard, ids: np.ndarray, local: np.ndarray,
                      run: slice | None) -> None:
        """The action rows of envs ids (global; local on the shard; run: the
        slice they fill, or None) into the shard's buffers, where its daemon
        reads them.  Each env's row goes to its own row there, so envs
        filling a run are copied as one block whatever their order."""
        theirs, ours, agents = shard.buffers["actions"], self._host.buffers["actions"], self._agents
        if run is not None:
            start = shard.rows.start
            theirs[(run.start - start) * agents:(run.stop - start) * agents] = \
                ours[run.start * agents:run.stop * agents]
            return
        theirs[shard.rows_of(local)] = ours[shard.rows_of(ids)]

    # ---- the shards' tickets --------------------------------------------------------------
    def _waiting_anywhere(self) -> bool:
        """A recv is out at some daemon (which refuses a reset then)."""
        return any(shard.recv is not None and shard.recv.posted and not shard.recv.done
                   for shard in self._shards)

    def _post_send(self, k: int, ids: np.ndarray, run: slice | None) -> None:
        """Send the shard's part ids (global; run: the slice they fill, or None)."""
        shard = self._shards[k]
        local = ids - shard.rows.start
        self._copy_actions(shard, ids, local, run)
        try:
            ticket = shard.stepper.post_send(local)
        except EnvdError as exc:
            self._raise_failed(shard, exc)
        if ticket.done and ticket.error is not None:
            # refused at once (a transport that answers a send at once):
            # raised by the send itself, none of its envs stepped
            self._raise_failed(shard, ticket.error)
        self._state[run if run is not None else ids] = IN_FLIGHT
        shard.in_flight += len(ids)
        if not ticket.done:
            shard.sends.append((ticket, ids))

    def _post_recv(self, shard: _Shard) -> None:
        """Let one recv wait on the shard's daemon for its first batch to finish."""
        try:
            shard.recv = shard.stepper.post_recv(shard.in_flight)
        except EnvdError as exc:
            self._raise_failed(shard, exc)

    def _start_call(self) -> None:
        """Every call first: refuse a lost env; take in the answers that came."""
        if self._lost_daemon.error is not None:
            self._host.check_not_lost()
        for shard in self._shards:
            self._poll(shard)

    def _poll(self, shard: _Shard) -> None:
        """Take in the shard's answers that came (never waiting)."""
        ticket = shard.recv if shard.recv is not None else (
            shard.sends[0][0] if shard.sends else None)
        if ticket is None:
            return
        try:
            done = shard.stepper.poll(ticket)
        except EnvdError as exc:
            self._raise_failed(shard, exc)
        if done or shard.sends:
            self._take_in(shard)

    def _wait(self, deadline: float, call: str) -> None:
        """Sleep until some daemon with envs in flight has news (or
        deadline: EnvdTimeoutError), then take it in."""
        pending = []
        for shard in self._shards:
            if shard.in_flight and shard.recv is None and not self._async_lost:
                self._post_recv(shard)
            if shard.recv is not None and not shard.recv.done:
                pending.append((shard.index, shard.stepper, shard.recv))
        if not pending:
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            self._async_lost = True  # the late answers' ids would be lost to us
            waiting = ", ".join(self._shards[k].endpoint for k, _, _ in pending)
            raise EnvdTimeoutError(
                f"{self._env_id}: no env finished on the daemons at {waiting} within "
                f"{self._timeout():g} s (Client timeout) during {call}(); they are stuck or "
                "overloaded")
        try:
            ready, check = self._waiter.wait(pending, min(remaining, _POLL_SLICE_S))
        except EnvdError as exc:
            self._raise_failed(None, exc)
        for k in check:
            shard = self._shards[k]
            try:
                shard.stepper.check_alive(f"envs in flight ({call})")
            except EnvdError as exc:
                self._raise_failed(shard, exc)
        for k in ready:
            self._poll(self._shards[k])

    def _take_in(self, shard: _Shard) -> None:
        """Act on the shard's tickets done so far: its sends' (in the order
        they were posted), then its recv's; then let a recv wait there
        again while envs are in flight."""
        while shard.sends and shard.sends[0][0].done:
            ticket, ids = shard.sends.pop(0)
            if ticket.error is not None:  # refused before any env stepped: idle again
                self._state[ids] = IDLE
                shard.in_flight -= len(ids)
                if self._refusal is None:
                    self._refusal = self._named(ticket.error, shard)
        received = shard.recv
        if received is None or not received.done:
            return
        shard.recv = None
        self._take_recv(shard, received)
        if shard.in_flight and not self._async_lost:
            self._post_recv(shard)

    def _take_recv(self, shard: _Shard, ticket: Ticket) -> None:
        if ticket.lost:
            assert ticket.error is not None
            raise self._lost(shard, ticket.error)
        if ticket.error is not None:
            # EnvStateError: refused for want of envs, which only a send
            # refused before it causes (its refusal says why, raised once,
            # and in_flight was corrected; a reset may have forgotten it).
            # Else an env failed in a batch: the next recv raises it, and
            # the batch's envs come with the recv after it.
            if not isinstance(ticket.error, EnvStateError) and self._failure is None:
                self._failure = self._named(ticket.error, shard)
            return
        local = ticket.ids
        assert local is not None  # (a recv done without an error names its envs)
        if not len(local) and not shard.in_flight:
            return  # (a refused SENDRECV's recv: nothing was in flight)
        run = self._check_answered_ids(shard, local)
        self._add_ready(shard, local, run)
        shard.in_flight -= len(local)

    def _check_answered_ids(self, shard: _Shard, local: np.ndarray) -> slice | None:
        """Refuse a daemon's recv answer whose env ids could not be its own
        (the rows are gathered and the books indexed with them unchecked).
        Refuses an answer naming an env twice, or one not in flight (say,
        answered before) too: the books mark a run by its slice, and a send
        of a batch straight back skips the id checks (envd.vec_rows.LastBatch),
        so a recv's batch must name each env once.  Returns the slice of
        global ids they fill, if they do."""
        count = shard.rows.stop - shard.rows.start
        in_order = False  # (a run in increasing order: EnvPool's every batch)
        if not 1 <= len(local) <= shard.in_flight:
            low = high = -1
        else:
            low, high, in_order = _span(local, self._positions)
        if low < 0 or high >= count:
            raise ProtocolError(f"{shard.where} answered a recv with {len(local)} env ids "
                                f"(of {shard.in_flight} in flight there, ids within "
                                f"0..{count - 1} expected)")
        if not in_order and self._repeat_check.repeats(local):
            raise ProtocolError(f"{shard.where} answered a recv naming an env twice")
        start = shard.rows.start
        if in_order:  # (a bytes compare: a third of (... == IN_FLIGHT).all())
            in_flight = (self._state[low + start:high + 1 + start].tobytes()
                         == self._all_in_flight[:len(local)])
        else:
            in_flight = not (self._state[local + start] != IN_FLIGHT).any()
        if not in_flight:  # (e.g. an env answered before: it would be received twice)
            raise ProtocolError(f"{shard.where} answered a recv naming an env not in flight "
                                "there")
        run = _run_of(low, high, len(local))
        return None if run is None else slice(run.start + shard.rows.start,
                                              run.stop + shard.rows.start)

    # ---- errors -----------------------------------------------------------------------------
    def _raise_failed(self, shard: _Shard | None, error: BaseException) -> NoReturn:
        """Raise for a call on a shard's stepper (None: the waiter's) that
        raised error: its daemon gone marks the env lost and names it; a
        timeout loses the async books (the fate of the envs out is
        unknown); any other envd error is named after the daemon."""
        named: BaseException = error
        if isinstance(error, EnvdTimeoutError):
            self._async_lost = True
        elif shard is not None and isinstance(error, ConnectionLostError):
            named = self._lost(shard, error)
        elif shard is not None:
            named = self._named(error, shard)
        if named is error:
            raise error
        raise named from error

    def _named(self, error: BaseException, shard: _Shard) -> BaseException:
        return self._host.named(error, shard.index)

    def _lost(self, shard: _Shard, error: BaseException) -> ConnectionLostError:
        """Daemon `shard` is gone: the env refuses every call from now on."""
        self._host.mark_lost(shard.index, error)
        return ConnectionLostError(
            f"{self._env_id}: lost {shard.where} while envs were out (async mode): {error}; "
            "the other daemons' sessions stay open until close(); close this env and make "
            "a new one")

    def _raise_refusal(self) -> None:
        if self._refusal is not None:
            refusal, self._refusal = self._refusal, None
            raise refusal

    def _raise_failure(self) -> None:
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure

    def _check_async_state(self) -> None:
        if self._async_lost:
            raise EnvStateError(
                f"a send or recv on this {self._env_id} env timed out, so which envs are in "
                "flight is unknown; close it and make a new env")

