"""RequestEngine: the native request engine (native/src/engine.h) for a front
door that never blocks (the daemon's event loop).

A request (a step, a recv of at least ``least`` and at most ``most`` envs, a
settle: "tell me once no env is in flight") is submitted for a session with
a tag; its Completion comes back at once (a step run inline, a recv with
enough envs ready, a refusal) or from a later poll(), which the front door
calls when the pool's eventfd fires.  The engine keeps what waits, one
request per session, in C, and decides each under its session's lock; the
front door only remembers what to answer for each tag.  A send is served
beside a waiting recv (send()), which may complete it.  The engine has two
other front doors: the doorbell thread (envd_engine_call, in C, which waits
for its request) and the in-process calls (NativeSession's step, send and
recv).  A session's one request is kept in the session itself, so a request
by any door while another's waits is refused the same way.

The completion's result is the C call's, and its error_index the env the
session named right after it, under the session's lock: the session that made
it turns a negative result into its error (NativeSession.step_result,
recv_error, send_error, given that index: the session's live one may name
another env by then, a batch of a later send having failed meanwhile).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from envd.errors import NativeError
from envd.native._envd_native import ffi, lib
from envd.native.native_vec import strerror

STEP, RECV, SETTLE = int(lib.ENVD_REQ_STEP), int(lib.ENVD_REQ_RECV), int(lib.ENVD_REQ_SETTLE)

#: Completions taken per C call of poll() (it calls again while one is full).
_POLL_BATCH = 64


class Completion(NamedTuple):
    """A request's end: its tag and kind, whether it was refused before
    anything started (a step: its inputs were not read), and the result
    (a step's envs done, a recv's count of ids, or an ENVD_E* code) and
    the env an error names (-1: none)."""
    tag: int
    kind: int
    refused: bool
    result: int
    error_index: int


def _completion(record) -> Completion:
    return Completion(int(record.tag), int(record.kind), bool(record.refused), int(record.result),
                      int(record.error_index))


class RequestEngine:
    """The requests that wait on the sessions of one daemon.  Owned by one
    thread (the event loop); the sessions' batches end on any thread."""

    def __init__(self) -> None:
        out = ffi.new("envd_engine_t **")
        rc = lib.envd_engine_create(out)
        if rc != lib.ENVD_OK:
            raise NativeError(f"creating the request engine failed: {strerror(rc)}", rc)
        self.handle = out[0]
        self._request = ffi.new("envd_request_t *")
        self._done = ffi.new("envd_completion_t *")
        self._records = ffi.new("envd_completion_t[]", _POLL_BATCH)

    def _submit(self, session, kind: int, tag: int) -> Completion | None:
        request = self._request
        request.kind, request.tag = kind, tag
        rc = lib.envd_engine_submit(self.handle, session, request, self._done)
        if rc == 1:
            return _completion(self._done)
        if rc != 0:  # (a bug of the front door: it checks requests first)
            raise NativeError(f"submitting a request failed: {strerror(rc)}", rc)
        return None

    def step(self, session, tag: int) -> Completion | None:
        """Submit a step of every env of session (a native session handle)."""
        return self._submit(session, STEP, tag)

    def recv(self, session, least: int, most: int, out: np.ndarray, tag: int) -> Completion | None:
        """Submit a recv of at least least and at most most ids into out (int64,
        most entries), which must stay alive until the completion."""
        request = self._request
        request.min_count, request.max_count = least, most
        request.out = ffi.from_buffer("int64_t[]", out)
        return self._submit(session, RECV, tag)

    def settle(self, session, tag: int) -> Completion | None:
        """Submit a request that completes once no env of session is in flight."""
        return self._submit(session, SETTLE, tag)

    def send(self, session, ids: np.ndarray,
             notify: bool = True) -> tuple[int, int, Completion | None]:
        """Send ids (int64, contiguous): the send's code, the env its refusal
        names (-1: none), and the completion of the session's waiting recv if
        the batch (run inline) completed it."""
        done = self._done
        rc = lib.envd_engine_send(self.handle, session, ffi.from_buffer("int64_t[]", ids),
                                  len(ids), lib.ENVD_JOB_NOTIFY if notify else 0, done)
        # (a refused send completes no recv: the record names the send's env)
        return int(rc), int(done.error_index) if rc else -1, (_completion(done) if done.kind
                                                              else None)

    def poll(self) -> list[Completion]:
        """The completions of the waiting requests that are done now."""
        done: list[Completion] = []
        while True:
            n = int(lib.envd_engine_poll(self.handle, self._records, _POLL_BATCH))
            done += [_completion(self._records[k]) for k in range(n)]
            if n < _POLL_BATCH:
                return done

    def forget(self, session) -> bool:
        """Drop session's waiting request (no completion comes): whether it had one."""
        return bool(lib.envd_engine_forget(self.handle, session))

    def waiting(self, kind: int = 0) -> int:
        """Requests waiting now (of kind; 0: any)."""
        return int(lib.envd_engine_waiting(self.handle, kind))

    def close(self) -> None:
        """Free the engine (what waits is forgotten).  Idempotent."""
        handle, self.handle = self.handle, ffi.NULL
        if handle != ffi.NULL:
            lib.envd_engine_destroy(handle)

    def __del__(self) -> None:
        self.close()
