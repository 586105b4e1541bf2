"""The rows of a batch of envs (a send's or a recv's): as a run (a slice),
checked for repeated ids, remembered from the last recv for the next send,
and gathered by recv into its batch buffers (GatherPlan, gather_plans: two
sets of batch buffers and the copies that fill them)."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

#: A copy of rows of buffers into batch buffers: copy(rows, run), rows
#: (int64, in range) and the same rows as a slice (run_of) or None.
RowCopy = Callable[[np.ndarray, "slice | None"], None]


class GatherPlan:
    """One of recv's two sets of batch buffers (slots: name -> array, plus
    "env_id") and the copies that fill it, one pair per buffer set it may
    read from (BatchedVecEnv._gather_sources): copiers[source] is
    (copy_always(rows, run), copy_on_done(rows, run)) (see numpy_row_copier), the
    second for a batch in which an episode ended (the buffers named in
    on_done_names).  obs: the observation over the slots when it is one
    array, as returned; None for a composite space, whose dict or tuple is
    built per recv (a caller may replace its entries: a cached one would
    hand those back two recvs later)."""

    def __init__(self, slots: dict[str, np.ndarray], on_done_names: frozenset[str], obs: Any,
                 copiers: list[tuple[RowCopy, RowCopy]]):
        self.slots, self.on_done_names, self.obs = slots, on_done_names, obs
        self.dones = slots["dones"]
        self.copiers = copiers

    def fill(self, rows: np.ndarray, source: int, read: np.ndarray, positions: np.ndarray,
             num_agents: int, copy: bool) -> tuple[dict[str, np.ndarray], Any, slice | None]:
        """Copy rows read (int64, in range) of buffer set source into the
        slots, and "env_id" from rows (the rows in the env's own buffers:
        each row's env).  Returns (out, any_done, run): the batch's buffers
        (the slots, or copies of those filled with copy=True), whether an
        episode ended in it, read as a slice (run_of) or None."""
        copy_always, copy_on_done = self.copiers[source]
        run = run_of(read, positions)
        copy_always(read, run)
        any_done = self.dones.any()
        if any_done:  # (no episode ended: the info has no statistics)
            copy_on_done(read, run)
        env_id = self.slots["env_id"]
        env_id[...] = rows if num_agents == 1 else rows // num_agents
        if copy:
            out = {name: slot.copy() for name, slot in self.slots.items()
                   if any_done or name not in self.on_done_names}
            return out, any_done, run
        return self.slots, any_done, run


def gather_plans(buffers: dict[str, np.ndarray], names: list[str],
                 on_done: Callable[[str], bool], rows: int,
                 sources: Sequence[dict[str, np.ndarray]],
                 row_copier: Callable[[list[tuple[np.ndarray, np.ndarray]]], RowCopy],
                 observation: Callable[[dict[str, np.ndarray]], Any]) -> list[GatherPlan]:
    """Two sets of batch buffers of `rows` rows for the buffers names (as
    buffers holds them, plus "env_id", int32) that recv alternates
    between, each with its copies from every buffer set of sources
    (row_copier(pairs) makes one; on_done(name): copied only for a batch
    in which an episode ended).  observation(slots): the observation
    over a set's buffers."""
    plans = []
    for _ in range(2):
        slots = {**{name: np.empty((rows, *buffers[name].shape[1:]), buffers[name].dtype)
                    for name in names},
                 "env_id": np.empty(rows, np.int32)}
        done_names = [name for name in names if on_done(name)]
        always = [name for name in names if name not in done_names]
        obs = observation(slots)
        copiers = [(row_copier([(source[n], slots[n]) for n in always]),
                    row_copier([(source[n], slots[n]) for n in done_names]))
                   for source in sources]
        plans.append(GatherPlan(slots, frozenset(done_names),
                                obs if isinstance(obs, np.ndarray) else None, copiers))
    return plans


def numpy_row_copier(pairs: list[tuple[np.ndarray, np.ndarray]]) -> RowCopy:
    """A function of (rows, run) copying rows (int64, in range) of each
    (buffer, slot) pair's buffer into its slot, in order; run: the same
    rows as a slice (run_of), or None.  (The in-process env's native
    copier, envd.native.batch_rows, does the same in one call.)"""
    def copy(rows: np.ndarray, run: slice | None) -> None:
        if run is not None:  # (a third of a take's cost)
            for buffer, slot in pairs:
                slot[...] = buffer[run]
            return
        for buffer, slot in pairs:
            # mode="clip" skips numpy's bounds check, which with out=
            # (mode "raise") copies through a temporary buffer -- about
            # half of a recv's own time for cheap envs.
            buffer.take(rows, axis=0, out=slot, mode="clip")
    return copy


def run_of(rows: np.ndarray, positions: np.ndarray) -> slice | None:
    """rows (int64) as a slice when they are consecutive and increasing (every
    batch of EnvPool's loop: a batch's envs are sent and finish together),
    else None.  positions: 0, 1, 2, ... (int64), at least as many as the
    buffers' rows.  A memcmp against positions, not np.diff: a recv's hot path."""
    count = len(rows)
    if count == 0:
        return None
    first = int(rows[0])
    if first < 0 or rows.dtype != positions.dtype:
        return None
    if rows.tobytes() != positions[first:first + count].tobytes():
        return None
    return slice(first, first + count)


class RepeatCheck:
    """Whether ids (int64, each in [0, size)) name one twice, in O(len(ids))
    (np.unique sorts or hashes: about 100 ns an id): stamp each id's
    position; a repeated id keeps only its last one.  For a send's ids and a
    daemon's recv answer (whose ids the client acts on)."""

    def __init__(self, size: int):
        self._stamp = np.zeros(size, np.int64)
        #: 0, 1, 2, ... (run_of's positions too)
        self.positions = np.arange(size, dtype=np.int64)

    def repeats(self, ids: np.ndarray) -> bool:
        if len(ids) > len(self._stamp):
            return True  # (more ids than there are, all in range)
        if run_of(ids, self.positions) is not None:
            return False  # (a sorted run: a memcmp, EnvPool's every batch)
        positions = self.positions[:len(ids)]
        self._stamp[ids] = positions
        # (ids are in range: "clip" skips numpy's buffered bounds check)
        return bool((self._stamp.take(ids, mode="clip") != positions).any())


class LastBatch:
    """The last recv's batch (of a single-agent env), so that a send of
    exactly those envs (EnvPool's loop: send(actions, info["env_id"])) skips
    the id checks (a recv's ids are in range and each once: the stepper's
    books say so in-process, and the client refuses a daemon's answer that
    does not, SocketStepper._check_answer_ids) and writes its actions as a
    slice when they were a run: about 8 us of a cheap env's batch.  A bytes
    compare tells whether a send's ids are that batch, whoever holds the
    array (the caller may have changed it in place)."""

    def __init__(self, env_id: np.ndarray, rows: slice | None):
        self._ids = env_id.tobytes()
        self._dtype = env_id.dtype
        #: the batch's rows as a slice (run_of), or None
        self.rows = rows

    def sends(self, env_ids: Any) -> bool:
        """env_ids (a send's) are this batch's ids, in its order."""
        return (env_ids.__class__ is np.ndarray and env_ids.dtype == self._dtype
                and env_ids.ndim == 1 and env_ids.tobytes() == self._ids)
