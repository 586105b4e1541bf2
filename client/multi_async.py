"""Async mode over several daemons: the stepper of a MultiVecEnv made with
batch_size < num_envs (``envd.connect([ep1, ep2]).make(id, N, batch_size=B)``).

Global env i lives on shard k (a RemoteVecEnv on daemon k holding the
consecutive envs ``shard_slices[k]``) as its local env ``i - start_k``.  Each
daemon's native session keeps the books of its own envs; the order in which
envs of *different* daemons finished exists only here, so this stepper keeps
the books across them, EnvPool's rules unchanged (envd.stepping):

- every env is IDLE, IN_FLIGHT or READY (one int8 per env);
- ``send(ids)`` posts each shard its part (one ``send`` message per daemon,
  after writing the action rows into that shard's buffers): the daemons step
  their parts at once, in parallel, and the trainer does not wait;
- while a daemon has envs in flight, exactly one ``recv {count: its envs in
  flight, min: 1}`` waits there (the daemon serves sends beside it: the
  ``recv_min`` capability).  The daemon answers it as soon as a batch
  finished, with every env ready then; the reply's ids are appended to one
  FIFO (as one entry: its shard and ids), in the order the replies were
  read (within a reply, the daemon's ready order).  Their rows stay in the
  shard's buffers: nothing writes them until the env is sent again;
- ``recv(count)`` returns the oldest count ids of that FIFO: exactly count,
  each env once.  While fewer are ready it waits on every daemon's socket and
  connection monitor with one zmq.Poller: the trainer's CPU sleeps.  A batch
  of one shard's envs (EnvPool's loop with a batch per daemon) is gathered
  straight from that shard's buffers (``batch_source``: one copy); a batch
  across shards first has its rows copied into the MultiVecEnv's buffers.
  Those buffers are therefore behind the shards' after a recv, and are
  brought up to date before a reset or step reads them (``_sync_buffers``).

Per env, the books keep one state byte; a batch whose ids are one run of
consecutive envs (in any order: a send's ids are unique, so min and max
tell) updates them with one slice, not per id.

That is the socket wire; client/multi_doorbell.py drives the same books
through the daemons' doorbells where every shard has the fast path.

A multi-agent env (agents as rows) works in whole envs, as on one daemon:
the books, the FIFO and every id a shard sends or receives name envs; only
the copies between the shards' buffers and the MultiVecEnv's, and a recv's
gather from a shard's buffers, move each env's num_agents rows
(agent-major: env i's rows are i*A .. i*A+A-1).

Refusals keep the one-daemon rules: a send of an env not idle raises at the
send (the books are here); a send the daemon refuses (a done env in
``disabled`` mode) is raised by the next call, naming the daemon, and its
envs are idle again; a recv of more than are in flight or ready raises at
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
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np
import zmq

from envd import protocol
from envd.errors import (
    ConnectionLostError,
    EnvdTimeoutError,
    EnvStateError,
    ProtocolError,
    SessionExpiredError,
    UnknownSessionError,
)
from envd.vec_errors import in_flight_error, not_idle_error, ready_error, recv_short_error
from envd.vec_rows import RepeatCheck, run_of

if TYPE_CHECKING:
    from envd.client.multi import MultiVecEnv
    from envd.client.remote_vector_env import RemoteVecEnv

IDLE, IN_FLIGHT, READY = 0, 1, 2
#: longest single poll: a lost daemon's monitor event wakes the poll anyway;
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


class _Shard:
    """One daemon's part of the books (``index``: its place among the
    shards): its envs in flight (sent, not yet received back), whether a
    recv waits there, and the replies read by its channel but not taken in
    yet (the channel runs reply callbacks under its lock, so they only
    queue; _take_in does the work)."""

    # ShardsDoorbellStepper's books (client/multi_doorbell.py), set on every
    # shard by its __init__ (declared here for the type checker only)
    rung: int
    sent_ids: np.ndarray | None
    remaining: dict[int, int]
    rung_at: float
    expected: float | None
    checked_at: float

    def __init__(self, index: int, env: RemoteVecEnv, rows: slice, endpoint: str):
        self.index = index
        self.env = env
        self.rows = rows
        self.endpoint = endpoint
        # the shard's stepper: its request encodings (shm or inline) and outputs
        self.stepper = env._stepper
        self.channel = self.stepper.channel
        self.in_flight = 0
        self.recv_waiting = False
        self.replies: list[tuple[str, np.ndarray | None, dict[str, Any]]] = []

    @property
    def where(self) -> str:
        return f"the daemon at {self.endpoint}, serving envs {self.rows.start}..{self.rows.stop - 1}"


class ShardsAsyncStepper:
    """The envd.stepping.Stepper of an async MultiVecEnv (see the module
    docstring).  Holds its env weakly, so a dropped env is freed without a cycle."""

    def __init__(self, env: MultiVecEnv):
        self._env = weakref.proxy(env)
        self._env_id = env.env_id
        self._shards = [_Shard(k, shard, rows, endpoint) for k, (shard, rows, endpoint)
                        in enumerate(zip(env.shards, env.shard_slices, env.shard_endpoints))]
        self._starts = np.array([shard.rows.start for shard in self._shards], np.int64)
        self._start_list = self._starts.tolist()  # (bisect: a send's owner in O(log k))
        self._agents = env.num_agents  # rows per env
        self._state = np.zeros(env.num_env_instances, np.int8)  # per env, not per row
        self._all_in_flight = bytes([IN_FLIGHT]) * len(self._state)  # (_check_answered_ids)
        self._positions = env._positions  # 0, 1, 2, ... (_span, run_of)
        self._repeat_check = RepeatCheck(env.num_env_instances)  # (_check_answered_ids)
        #: the FIFO of ready envs: (shard index, their ids there, global ids,
        #: the slice of global ids they fill or None), one entry per reply
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
        #: the first env failure a recv reply reported, raised by the next recv
        self._failure: BaseException | None = None
        #: a send or recv timed out: which envs are in flight is unknown
        self._async_lost = False
        self._timeout = max(shard.channel.timeout for shard in self._shards)
        self._poller = zmq.Poller()
        self._pollables: dict[zmq.Socket, tuple[int, bool]] = {}  # socket -> (shard, monitor?)
        for k, shard in enumerate(self._shards):
            socket, monitor = shard.channel.pollables()
            for sock, is_monitor in ((socket, False), (monitor, True)):
                self._poller.register(sock, zmq.POLLIN)
                self._pollables[sock] = (k, is_monitor)

    # ---- the Stepper protocol ------------------------------------------------------------
    def reset(self, with_seeds: bool, with_mask: bool) -> None:
        self._start_call()
        in_flight = self._in_flight()
        if in_flight:
            raise in_flight_error(self._env_id, "reset", in_flight)
        self._forget()  # (the ready ones, a refusal, a failure: as one daemon)
        self._sync_buffers()  # (a masked reset returns the other envs' rows as they are)
        self._env._run_reset(with_seeds, with_mask)

    def async_reset(self, with_seeds: bool) -> None:
        """Every shard's async reset at once, then all envs READY in env order."""
        self._start_call()
        # a daemon refuses a reset while a recv of the session waits: let
        # those recvs be answered (their envs are dropped with the rest)
        deadline = time.monotonic() + self._timeout
        while self._waiting_anywhere():
            self._wait(deadline, "async_reset")
        self._forget()
        env = self._env
        seeds = env._buffers["reset_seeds"]

        received: list[np.ndarray | None] = [None] * len(self._shards)

        def reset_shard(k: int) -> None:
            shard = self._shards[k]
            count = shard.rows.stop - shard.rows.start
            if with_seeds:  # (one seed per env: the first count entries)
                shard.env.buffers["reset_seeds"][:count] = seeds[shard.rows]
            # the daemon waits for the batches in flight and drops them
            shard.stepper.async_reset(with_seeds)
            # every earlier request's reply came before this one's (a daemon
            # answers a send at once, and no recv waits there now): a refused
            # send read here must not make envs idle that are ready now
            shard.replies.clear()
            shard.in_flight = 0
            received[k] = shard.stepper.recv(count)  # all of them, in env order

        env._dispatch(reset_shard, range(len(self._shards)))
        env._started[:] = True  # (a sync step once all are received: as after reset())
        env._all_started = True
        for shard, local in zip(self._shards, received):  # (env order: shard by shard)
            assert local is not None  # (_dispatch ran reset_shard for every shard)
            self._add_ready(shard, local, None)  # (idle after _forget: marked per id)

    def step(self) -> int:
        self._start_call()
        self._raise_refusal()
        in_flight = self._in_flight()
        if in_flight:
            raise in_flight_error(self._env_id, "step", in_flight)
        if self._num_ready:
            raise ready_error(self._env_id, self._num_ready)
        self._sync_buffers()  # (the step's checks read the envs' last flags there)
        return self._env._run_step()

    def send(self, env_ids: np.ndarray) -> None:
        self._start_call()
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
            if not self._shards[k].recv_waiting:
                self._post_recv(k)

    def recv(self, count: int) -> np.ndarray:
        self._start_call()
        self._check_async_state()
        self._raise_refusal()
        self._raise_failure()
        deadline = time.monotonic() + self._timeout
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
        for sock in self._pollables:
            self._poller.unregister(sock)
        self._pollables.clear()
        self._shards = []  # (their segments' mappings go with the shards)

    # ---- books ----------------------------------------------------------------------------
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
            self.batch_source = (shard.index, shard.stepper.rows_of(local))
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
                self._env._copy_results(k)
            self._behind = False

    def _copy_rows(self, shard: _Shard, local: np.ndarray) -> None:
        """The shard's output rows of its envs local into the env's buffers
        (for a batch across shards; one block copy when they are consecutive
        and ascending: fancy indexing costs more).  Env j of the shard is
        rows j*A .. j*A+A-1 there and (start+j)*A .. here."""
        buffers, theirs = self._env._buffers, shard.env.buffers
        first, count, agents = int(local[0]), len(local), self._agents
        offset = shard.rows.start * agents
        if int(local[-1]) - first + 1 == count and (count < 2 or (np.diff(local) == 1).all()):
            rows = slice(first * agents, (first + count) * agents)
            at = slice(rows.start + offset, rows.stop + offset)
            for name in self._env._outputs:
                buffers[name][at] = theirs[name][rows]
            return
        row_ids = shard.stepper.rows_of(local)
        for name in self._env._outputs:
            buffers[name][row_ids + offset] = theirs[name][row_ids]

    # ---- the wire ---------------------------------------------------------------------------
    def _waiting_anywhere(self) -> bool:
        """A request waits on some daemon for envs to finish."""
        return any(shard.recv_waiting for shard in self._shards)

    def _post_send(self, k: int, ids: np.ndarray, run: slice | None) -> None:
        """Send the shard's part ids (global; run: the slice they fill, or None)."""
        shard = self._shards[k]
        local = ids - shard.rows.start
        self._copy_actions(shard, ids, local, run)
        header, blobs = shard.stepper._request_send(local)  # (shm or inline encoding)
        inbox = shard.replies  # (the callback holds the list only: never the shard's
        # segment, should the daemon die and the channel keep the callback)
        self._post(shard, header, blobs, lambda reply: inbox.append(("send", ids, reply)))
        self._state[run if run is not None else ids] = IN_FLIGHT
        shard.in_flight += len(ids)

    def _copy_actions(self, shard: _Shard, ids: np.ndarray, local: np.ndarray,
                      run: slice | None) -> None:
        """The action rows of envs ids (global; local on the shard; run: the
        slice they fill, or None) into the shard's buffers, where its daemon
        reads them.  Each env's row goes to its own row there, so envs
        filling a run are copied as one block whatever their order."""
        theirs, ours, agents = shard.env.buffers["actions"], self._env._actions, self._agents
        if run is not None:
            start = shard.rows.start
            theirs[(run.start - start) * agents:(run.stop - start) * agents] = \
                ours[run.start * agents:run.stop * agents]
            return
        theirs[shard.stepper.rows_of(local)] = ours[self._env._rows_of(ids)]

    def _post_recv(self, k: int) -> None:
        """Let one recv wait on daemon k for its first batch to finish."""
        shard = self._shards[k]
        header, blobs = shard.stepper._request_recv(shard.in_flight)
        header["min"] = 1
        inbox = shard.replies
        self._post(shard, header, blobs, lambda reply: inbox.append(("recv", None, reply)))
        shard.recv_waiting = True

    def _post(self, shard: _Shard, header: dict[str, Any], blobs: Any, on_reply: Any) -> None:
        try:
            shard.channel.post(header, blobs, on_reply)
        except EnvdTimeoutError:
            self._async_lost = True  # earlier replies never came: their fate is unknown
            raise
        except ConnectionLostError as exc:
            raise self._lost(shard, exc) from exc

    def _start_call(self) -> None:
        """Every call first: refuse a lost env; take in the replies that came."""
        self._env._check_not_lost()
        for k in range(len(self._shards)):
            self._read(k)

    def _read(self, k: int) -> None:
        """Read daemon k's replies that came (never waiting) and take them in."""
        shard = self._shards[k]
        try:
            shard.channel.read_late_replies()
        except ConnectionLostError as exc:
            raise self._lost(shard, exc) from exc
        self._take_in(k)

    def _wait(self, deadline: float, call: str) -> None:
        """Sleep until some daemon's socket or connection monitor has news
        (or deadline: EnvdTimeoutError), then take it in."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            self._async_lost = True  # the late replies' ids would be lost to us
            waiting = ", ".join(shard.endpoint for shard in self._shards if shard.recv_waiting)
            raise EnvdTimeoutError(
                f"{self._env_id}: no env finished on the daemons at {waiting} within "
                f"{self._timeout:g} s (Client timeout) during {call}(); they are stuck or "
                "overloaded")
        for sock, _ in self._poller.poll(int(min(remaining, _POLL_SLICE_S) * 1000)):  # (as pyzmq would)
            k, is_monitor = self._pollables[sock]
            shard = self._shards[k]
            if is_monitor:
                try:
                    shard.channel.check_alive(f"envs in flight ({call})")
                except ConnectionLostError as exc:
                    raise self._lost(shard, exc) from exc
            else:
                self._read(k)

    def _take_in(self, k: int) -> None:
        """Act on daemon k's replies read so far, in the order they came;
        then let a recv wait there again while envs are in flight."""
        shard = self._shards[k]
        while shard.replies:
            kind, ids, reply = shard.replies.pop(0)
            if kind == "send":
                assert ids is not None  # (a send's reply comes with its ids)
                if not reply.get("ok"):  # refused before any env stepped: idle again
                    self._state[ids] = IDLE
                    shard.in_flight -= len(ids)
                    if self._refusal is None:
                        self._refusal = self._named(protocol.error_from_reply(reply), shard)
            else:
                shard.recv_waiting = False
                self._take_recv(shard, reply)
        if shard.in_flight and not shard.recv_waiting and not self._async_lost:
            self._post_recv(k)

    def _take_recv(self, shard: _Shard, reply: dict[str, Any]) -> None:
        if not reply.get("ok"):
            error = protocol.error_from_reply(reply)
            if isinstance(error, (SessionExpiredError, UnknownSessionError,
                                  ConnectionLostError)):
                raise self._lost(shard, error)
            # EnvStateError: refused for want of envs, which only a send
            # refused before it causes (its refusal says why, raised once,
            # and in_flight was corrected; a reset may have forgotten it).
            # Else an env failed in a batch: the next recv raises it, and
            # the batch's envs come with the recv waiting there next.
            if not isinstance(error, EnvStateError) and self._failure is None:
                self._failure = self._named(error, shard)
            return
        blobs = reply.get("_blobs", [])
        local = np.frombuffer(blobs[0], np.int64).copy() if blobs else np.empty(0, np.int64)
        run = self._check_answered_ids(shard, local)
        shard.stepper._take_outputs(reply, blobs[1:], local)  # (inline: into its buffers)
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
    def _named(self, error: BaseException, shard: _Shard) -> BaseException:
        from envd.client.multi import _naming  # (multi imports this module)
        return _naming(error, shard.endpoint, f", serving envs {shard.rows.start}.."
                                              f"{shard.rows.stop - 1}",
                       shard.rows.start * self._agents)

    def _lost(self, shard: _Shard, error: BaseException) -> ConnectionLostError:
        """Daemon `shard` is gone: the env refuses every call from now on."""
        self._env._mark_lost(self._shards.index(shard), error)
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
