"""The rows of a batch of envs (a send's or a recv's): as a run (a slice),
checked for repeated ids, remembered from the last recv for the next send,
and gathered by recv into its batch buffers."""
from __future__ import annotations

from typing import Any

import numpy as np


class GatherPlan:
    """One of recv's two sets of batch buffers (slots: name -> array, plus
    "env_id") and the copies that fill it, one pair per buffer set it may
    read from (BatchedVecEnv._gather_sources): copiers[source] is
    (copy_always(rows, run), copy_on_done(rows, run)) (see BatchedVecEnv._row_copier), the
    second for a batch in which an episode ended (the buffers named in
    on_done_names).  obs: the observation over the slots when it is one
    array, as returned; None for a composite space, whose dict or tuple is
    built per recv (a caller may replace its entries: a cached one would
    hand those back two recvs later)."""

    def __init__(self, slots: dict[str, np.ndarray], on_done_names: frozenset[str], obs: Any,
                 copiers: list[tuple[Any, Any]]):
        self.slots, self.on_done_names, self.obs = slots, on_done_names, obs
        self.dones = slots["dones"]
        self.copiers = copiers


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
