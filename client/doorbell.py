"""The trainer's side of the same-host fast path: ring a session's doorbell
in shared memory and wait for the daemon's native thread to answer, without a
socket round trip.  The daemon's side, and the doorbell's layout, are in
native/src/doorbell.h; this module needs only ctypes (for the futex system
call), never envd's native code.

A request (a step, a send, a recv, or a SENDRECV: a send and the recv of
its envs, answered once -- client/transports/doorbell_stepper.py): its
inputs (actions, env ids) are already in shared memory; write req_count and req_kind, then req_seq + 1
(x86-64 keeps stores in program order, so the daemon, reading req_seq with
acquire, sees the inputs, the count and the kind), then a full barrier, then
FUTEX_WAKE req_seq only if the daemon's thread said it sleeps there
(server_asleep: it sets that flag, with a barrier, before it reads req_seq
and sleeps, so one of the two sees the other's store; native/src/doorbell.h,
Ordering).  A thread that spins for the next request -- a trainer stepping
back to back -- is spared the system call (2 us of the trainer's own time
per ring on a 2-CPU VM, on the way to every answer).  A step or recv first
spins a few microseconds on done_seq itself (Doorbell.quick_answer: a cheap
env's whole step at N=64 through the daemon; only while answers came that
soon).  Then wait until done_seq equals
our req_seq in three stages (Doorbell.wait): spin while the answer is
expected within microseconds (a step small enough to run on the daemon's
serving thread alone, a recv whose envs are ready, any send); then, for a
step, yield the CPU between checks (os.sched_yield) while it is expected
soon and no other trainer's requests run on the daemon; then sleep on
done_seq's futex with client_waiting set, in slices, so that a daemon that
died (the socket's monitor says so) or a timeout is noticed (the first two
stages, 2 ms at most, do not look: they are noticed that much later).
Yielding, not sleeping, is what
keeps a large step close to in-process on a small machine: the client stays
runnable, so the daemon's pool workers get its CPU while they step (a
spinning client would keep it from them) and the answer needs no
cross-CPU wake-up of a sleeping client (20-40 us; docs/benchmarks.md).
"""
from __future__ import annotations

import _thread
import ctypes
import mmap
import os
import platform
import time
from collections.abc import Callable
from typing import Literal

from envd import _native_facts

_SYS_FUTEX = 202  # x86-64
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
#: the request kinds (req_kind), and the status of a request the daemon
#: refused because it drains: native/src/doorbell.h's, generated into envd._native_facts
STEP, SEND, RECV = _native_facts.DOORBELL_STEP, _native_facts.DOORBELL_SEND, _native_facts.DOORBELL_RECV
#: a send and then a recv of its count, answered once (client/transports/doorbell_stepper.py)
SENDRECV = _native_facts.DOORBELL_SENDRECV
SHUTTING_DOWN = _native_facts.DOORBELL_SHUTTING_DOWN
#: envd_doorbell_header_t's fields: name -> (byte offset, size)
_FIELDS = _native_facts.DOORBELL_HEADER_FIELDS
#: longest sleep on the futex before the client checks the connection
_SLICE_S = 0.02
#: spin (without yielding) while answers are expected sooner than this: a
#: step that soon ran on the daemon's serving thread alone, so no worker
#: needs this CPU; a recv that soon found its envs ready
_SPIN_LIMIT_S = {STEP: 30e-6, RECV: 100e-6, SENDRECV: 100e-6}
#: the longest such spin
_SPIN_MAX_S = 150e-6
#: a send is answered as soon as the daemon started its batch: spin this long
#: for it (never yield: the workers it woke would keep the CPU for a while)
_SEND_SPIN_S = 200e-6
#: a step (the only work in flight: the workers sleep once it is done) then
#: yields the CPU between checks for up to twice its expected time plus
#: _YIELD_EXTRA_S, and at most _YIELD_MAX_S, before sleeping on the futex --
#: unless the daemon's last answer said other trainers' requests were running
#: (contended: several yielding trainers would hand the CPUs to each other,
#: not to the workers).  Not a recv: a worker given the CPU may go on with a
#: batch sent later.
_YIELD_EXTRA_S = 100e-6
_YIELD_MAX_S = 2e-3
#: Doorbell.quick_answer's turns (a read of done_seq each: about 3 us on a
#: 2-CPU VM, where a cheap env's step on the daemon's serving thread is
#: answered within 1-2 us)
_QUICK_TURNS = range(64)
#: ... taken only while the request's kind was answered sooner than this
#: (wait's running estimate): a step that takes longer leaves the CPU to the
#: daemon's workers, and a client that shares its CPU with the daemon's
#: serving thread (a busy host) lets it run rather than spin
_QUICK_WITHIN_S = 5e-6


_sched_yield = os.sched_yield
_perf_counter = time.perf_counter


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def unavailable() -> str | None:
    """Why this process cannot use the fast path, or None."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return (f"the fast path needs Linux on x86-64 (its doorbell relies on x86's store "
                f"order), not {platform.system()} {platform.machine()}")
    return None


class Doorbell:
    """One session's doorbell in its mapped segment ``memory`` at ``offset``."""

    def __init__(self, memory: mmap.mmap, offset: int):
        whole = memoryview(memory)

        def word(name: str, code: Literal["I", "i", "q"]) -> memoryview[int]:
            """The field as a one-item memoryview: read and written as
            word[0], an aligned load or store of the whole word, three times
            cheaper than a numpy scalar's (the spin loops read done_seq)."""
            field_offset, size = _FIELDS[name]
            start = offset + field_offset
            view = whole[start:start + size].cast(code)
            assert view.itemsize == size, name
            return view

        self._req_seq = word("req_seq", "I")
        self._req_kind = word("req_kind", "I")
        self._client_waiting = word("client_waiting", "I")
        self._req_count = word("req_count", "I")
        self._done = word("done_seq", "I")
        self._status = word("status", "i")
        self._result = word("result", "q")
        self._error_index = word("error_index", "q")
        self._closed = word("closed", "I")
        self._contended = word("contended", "I")
        self._sent = word("sent", "I")
        self._server_asleep = word("server_asleep", "I")
        self._missed_rings = word("missed_rings", "I")
        # Taken and released after each ring, never held: an uncontended
        # lock's acquire is an atomic read-modify-write (LOCK-prefixed on
        # x86-64: CPython's locks are semaphores or atomic bytes), a full
        # barrier that keeps the read of server_asleep after the store of
        # req_seq -- a plain load could pass the store (x86's one reordering).
        # Only CPython's own lock is known to be one (gevent's, patched in,
        # is not): with any other, every ring wakes.
        self._barrier = _thread.allocate_lock()
        self._barrier_is_native = type(self._barrier).__module__ == "_thread"
        message_offset, message_size = _FIELDS["message"]
        self._message = whole[offset + message_offset:offset + message_offset + message_size]
        # the futex words' addresses (the ctypes objects are kept: the
        # address is valid while something holds the mapping's buffer)
        self._req_word = ctypes.c_uint32.from_buffer(memory, offset + _FIELDS["req_seq"][0])
        self._done_word = ctypes.c_uint32.from_buffer(memory, offset + _FIELDS["done_seq"][0])
        self._req_addr = ctypes.addressof(self._req_word)
        self._done_addr = ctypes.addressof(self._done_word)
        self.seq = self._req_seq[0]  # the last request rung
        # running estimate of how long an answer takes, per request kind
        # (a send is answered at once, a recv when its envs are stepped)
        self._expected = {STEP: 0.0, SEND: 0.0, RECV: 0.0, SENDRECV: 0.0}
        self._kind = STEP
        libc = ctypes.CDLL(None, use_errno=True)
        self._syscall = libc.syscall
        self._syscall.restype = ctypes.c_long
        self._syscall.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint,
                                  ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint]
        self._timespec = _Timespec()
        self._timespec_ref = ctypes.byref(self._timespec)

    @property
    def closed(self) -> bool:
        """The daemon stopped serving this doorbell (closed or expired session)."""
        return bool(self._closed[0])

    def message(self) -> str:
        """What the last request that failed with ENVD_EENV failed on, as the
        daemon's backend words it ("" when it said nothing more): read
        right after its answer (the next failure rewrites it)."""
        data = self._message.tobytes()
        return data[:data.find(b"\0") if b"\0" in data else len(data)].decode("utf-8", "replace")

    @property
    def sent(self) -> bool:
        """The answered SENDRECV started its batch (its answer is the
        RECV's); False: its SEND was refused (the answer says why)."""
        return bool(self._sent[0])

    @property
    def answered(self) -> bool:
        """The last request rung has its answer."""
        return self._done[0] == self.seq

    def ring(self, kind: int = STEP, count: int = 0) -> None:
        """Request kind (STEP, SEND, RECV or SENDRECV; count: the env ids
        sent, or the envs a recv wants, or both) once its inputs are in
        shared memory."""
        self._req_count[0] = count  # (first: a bad count raises before seq moves)
        self._req_kind[0] = kind
        self.seq = (self.seq + 1) & 0xFFFFFFFF
        self._kind = kind
        self._req_seq[0] = self.seq
        barrier = self._barrier
        # Without the barrier (not CPython's own lock, or this one held,
        # which one caller ringing at a time never does) the read of the
        # flag could pass the store: wake as if the thread slept.
        if not self._barrier_is_native or not barrier.acquire(False):
            self._wake_server()
            return
        barrier.release()
        if self._server_asleep[0]:
            self._wake_server()

    def _wake_server(self) -> None:
        self._syscall(_SYS_FUTEX, self._req_addr, _FUTEX_WAKE, 1, None, None, 0)

    @property
    def missed_rings(self) -> int:
        """The daemon's count of its sleep slices that ran out although a
        request had been rung: a ring that did not wake it.  0 but for rare
        races at the end of a slice (a client preempted between its store
        and its read of server_asleep across it, or a ring landing just as
        it ran out, which costs nothing)."""
        return self._missed_rings[0]

    def wait(self, deadline: float, check_alive: Callable[[], None]) -> tuple[int, int, int] | None:
        """(status, result, error index) of the last request; None if the
        daemon closed the doorbell without answering it; raises what
        check_alive raises; TimeoutError after deadline (time.monotonic)."""
        start = _perf_counter()
        done, seq = self._done, self.seq  # (locals: the spin reads them every turn)
        kind = self._kind
        expected = self._expected[kind]
        if kind == SEND:
            spin = _SEND_SPIN_S
        else:
            spin = min(2 * expected + 20e-6, _SPIN_MAX_S) if expected < _SPIN_LIMIT_S[kind] else 0
        spin_until = start + spin
        # The word itself, not the answered property: a turn of this loop
        # is how late the answer is seen (a cheap env's whole step through
        # the daemon is a few microseconds).
        while done[0] != seq:
            if _perf_counter() >= spin_until:
                break
        else:
            return self._answer(start)
        if kind == STEP and not self._contended[0]:  # (the last answer's word)
            yield_until = start + min(2 * expected + _YIELD_EXTRA_S, _YIELD_MAX_S)
            while _perf_counter() < yield_until:
                if done[0] == seq:
                    return self._answer(start)
                _sched_yield()
        while not self.answered:
            if self.closed:
                return self._answer(start) if self.answered else None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            self._sleep(min(_SLICE_S, remaining))
            if not self.answered:
                check_alive()
        return self._answer(start)

    def quick_answer(self) -> tuple[int, int, int] | None:
        """(status, result, error index) of the last request if done_seq
        says it is answered within a few microseconds of spinning, else None
        (then wait).  Right after the ring, with nothing else on the way:
        at N=64 a cheap env's whole step through the daemon takes a few
        microseconds, and each call layer or clock reading of wait a tenth
        of one (docs/benchmarks.md)."""
        expected, kind = self._expected, self._kind
        if expected[kind] >= _QUICK_WITHIN_S:
            return None
        done, seq = self._done, self.seq
        for _ in _QUICK_TURNS:
            if done[0] == seq:
                expected[kind] *= 0.75  # (a sample of about 0 for wait's estimate)
                return self._status[0], self._result[0], self._error_index[0]
        return None

    def _sleep(self, seconds: float) -> None:
        """Sleep on done_seq while it is not our answer (or seconds pass)."""
        self._client_waiting[0] = 1  # before the kernel compares done_seq
        try:
            current = self._done[0]
            if current != self.seq:
                self._timespec.tv_sec = int(seconds)
                self._timespec.tv_nsec = int((seconds - int(seconds)) * 1e9)
                self._syscall(_SYS_FUTEX, self._done_addr, _FUTEX_WAIT, current,
                              self._timespec_ref, None, 0)
        finally:
            self._client_waiting[0] = 0

    def answer(self) -> tuple[int, int, int]:
        """(status, result, error index) of the last request, once answered
        (for a caller that rang it and waited elsewhere: wait_any)."""
        return self._status[0], self._result[0], self._error_index[0]

    def _answer(self, start: float) -> tuple[int, int, int]:
        expected, kind = self._expected, self._kind
        expected[kind] += (_perf_counter() - start - expected[kind]) * 0.25
        return self._status[0], self._result[0], self._error_index[0]


class _FutexWaitv(ctypes.Structure):
    _fields_ = [("val", ctypes.c_uint64), ("uaddr", ctypes.c_uint64),
                ("flags", ctypes.c_uint32), ("reserved", ctypes.c_uint32)]


_SYS_FUTEX_WAITV = 449  # x86-64, Linux 5.16+
_FUTEX2_SIZE_U32 = 0x02  # (shared: the words live in segments mapped by two processes)
_CLOCK_MONOTONIC = 1
_libc = ctypes.CDLL(None, use_errno=True)
_futex_waitv_missing = False


def wait_any(bells: list[Doorbell], seconds: float) -> None:
    """Sleep until one of bells (each rung, maybe answered) has its answer,
    or about `seconds` pass: one futex_waitv over their done_seq words (the
    trainer's CPU sleeps; a caller driving several daemons waits on all at
    once).  Where the kernel lacks futex_waitv, a sleep of at most 1 ms on
    the first one instead.  Returns without saying which: check answered."""
    global _futex_waitv_missing
    for bell in bells:
        bell._client_waiting[0] = 1  # before done_seq is read: the daemon wakes us then
    try:
        waiters = (_FutexWaitv * len(bells))()
        for i, bell in enumerate(bells):
            current = bell._done[0]
            if current == bell.seq:
                return  # answered already
            waiters[i].val, waiters[i].uaddr = current, bell._done_addr
            waiters[i].flags = _FUTEX2_SIZE_U32
        if _futex_waitv_missing:
            bells[0]._sleep(min(seconds, 1e-3))
            return
        deadline = time.clock_gettime(time.CLOCK_MONOTONIC) + seconds
        timeout = _Timespec(int(deadline), int((deadline - int(deadline)) * 1e9))
        rc = _libc.syscall(ctypes.c_long(_SYS_FUTEX_WAITV), ctypes.byref(waiters),
                           ctypes.c_uint(len(bells)), ctypes.c_uint(0), ctypes.byref(timeout),
                           ctypes.c_int(_CLOCK_MONOTONIC))
        if rc == -1 and ctypes.get_errno() == 38:  # ENOSYS: an older kernel
            _futex_waitv_missing = True
    finally:
        for bell in bells:
            bell._client_waiting[0] = 0
