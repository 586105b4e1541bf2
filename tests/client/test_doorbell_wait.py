"""How the fast path's client waits for an answer (envd.client.doorbell,
Doorbell.wait): a step long enough to run on the daemon's pool yields its CPU
between checks (the workers need it; no wake-up at the end), a send and a
recv never yield (a worker given the CPU could keep it for a time slice), and
each ends on the futex sleep.  A doorbell in a private mapping with a thread
of the test as the daemon; the answers come from events, never from time."""
from __future__ import annotations

import mmap
import threading
import time

import pytest

from envd.client import doorbell as doorbell_module
from envd.client.doorbell import RECV, SEND, STEP, Doorbell

OFFSET = 128  # native/src/doorbell.h ENVD_DOORBELL_OFFSET
DEADLINE_S = 30.0


def far_deadline() -> float:
    return time.monotonic() + DEADLINE_S


def answer(bell: Doorbell) -> None:
    """What the daemon does: publish done_seq = req_seq and wake a sleeper."""
    bell._done[0] = bell.seq
    bell._syscall(doorbell_module._SYS_FUTEX, bell._done_addr, doorbell_module._FUTEX_WAKE,
                  1, None, None, 0)


def forbid_yield(monkeypatch, why: str) -> None:
    def forbidden_yield():
        raise AssertionError(f"yielded {why}")

    monkeypatch.setattr(doorbell_module, "_sched_yield", forbidden_yield)


def wait_answered_once_asleep(bell: Doorbell, kind: int, count: int = 0) -> bool:
    """Ring kind and wait, a thread of the test answering only once the
    client sleeps on done_seq (client_waiting set): whether it saw it asleep."""
    asleep = threading.Event()

    def daemon():
        deadline = time.monotonic() + DEADLINE_S
        while bell._client_waiting[0] == 0 and time.monotonic() < deadline:
            time.sleep(1e-4)  # poll interval
        if bell._client_waiting[0]:
            asleep.set()
        answer(bell)

    thread = threading.Thread(target=daemon)
    bell.ring(kind, count)
    thread.start()
    try:
        assert bell.wait(far_deadline(), lambda: None) == (0, 0, 0)
    finally:
        thread.join(DEADLINE_S)
    return asleep.is_set()


@pytest.fixture
def bell():
    # (the mapping is freed with the doorbell's views: they export its buffer)
    return Doorbell(mmap.mmap(-1, 4096), OFFSET)


def test_a_long_step_yields_until_its_answer(bell, monkeypatch):
    bell._expected[STEP] = 500e-6  # a pooled step: no pure spin, yield
    # (a window no preemption of this test can outlast: the answer comes
    # from the third yield, never from the futex sleep)
    monkeypatch.setattr(doorbell_module, "_YIELD_MAX_S", DEADLINE_S)
    monkeypatch.setattr(doorbell_module, "_YIELD_EXTRA_S", DEADLINE_S)
    yields = []

    def counting_yield():
        yields.append(1)
        if len(yields) == 3:
            answer(bell)  # the daemon answers while the client yields

    monkeypatch.setattr(doorbell_module, "_sched_yield", counting_yield)
    bell.ring(STEP)
    assert bell.wait(far_deadline(), lambda: None) == (0, 0, 0)
    assert len(yields) == 3
    assert bell._client_waiting[0] == 0


@pytest.mark.parametrize("kind", [SEND, RECV])
def test_a_send_or_a_recv_never_yields_and_ends_asleep(bell, monkeypatch, kind):
    bell._expected[kind] = 500e-6  # (a send's estimate is ignored: it always spins)
    forbid_yield(monkeypatch, "while waiting for a send or a recv")
    assert wait_answered_once_asleep(bell, kind, 1)


def test_a_short_step_spins_without_yielding(bell, monkeypatch):
    bell._expected[STEP] = 1e-6  # answered on the serving thread alone

    class FrozenClock:
        """time for the doorbell module: perf_counter stands still (the spin
        never times out) and the daemon answers at its fifth reading, so the
        answer can only be found by the spin loop."""
        def __init__(self):
            self.calls = 0

        def perf_counter(self) -> float:
            self.calls += 1
            if self.calls == 5:
                answer(bell)
            return 0.0

        monotonic = staticmethod(time.monotonic)

    clock = FrozenClock()
    forbid_yield(monkeypatch, "while the answer was due within microseconds")
    monkeypatch.setattr(doorbell_module, "time", clock)
    monkeypatch.setattr(doorbell_module, "_perf_counter", clock.perf_counter)
    bell.ring(STEP)
    assert bell.wait(far_deadline(), lambda: None) == (0, 0, 0)
    assert clock.calls >= 5
    assert bell._client_waiting[0] == 0  # never went to sleep


def test_a_long_step_sleeps_instead_when_the_daemon_is_contended(bell, monkeypatch):
    """Other trainers' requests ran as the last answer was written: yielding
    trainers would hand the CPUs to each other, so the step sleeps."""
    bell._expected[STEP] = 500e-6
    bell._contended[0] = 1
    forbid_yield(monkeypatch, "although the daemon said it was contended")
    wait_answered_once_asleep(bell, STEP)


# ---- the ring: a FUTEX_WAKE only for a daemon thread that said it sleeps -------------

def counting_wakes(bell: Doorbell) -> list[int]:
    wakes: list[int] = []
    bell._wake_server = lambda: wakes.append(bell.seq)
    return wakes


@pytest.mark.parametrize("kind", [STEP, SEND, RECV])
def test_a_ring_wakes_the_daemon_thread_only_when_it_sleeps(bell, kind):
    wakes = counting_wakes(bell)
    bell._server_asleep[0] = 0  # spinning for the next request: it sees req_seq
    bell.ring(kind, 3)
    assert wakes == []
    assert (bell._req_seq[0], bell._req_kind[0], bell._req_count[0]) == (bell.seq, kind, 3)
    bell._server_asleep[0] = 1  # asleep on req_seq (or about to be)
    bell.ring(kind, 3)
    assert wakes == [bell.seq]


def test_a_ring_without_its_barrier_wakes_the_daemon_thread_anyway(bell):
    """The barrier is a lock nobody holds; should it ever be held, the ring
    cannot order its read of server_asleep after its store, so it wakes."""
    wakes = counting_wakes(bell)
    bell._server_asleep[0] = 0
    bell._barrier.acquire()
    try:
        bell.ring(STEP)
    finally:
        bell._barrier.release()
    assert wakes == [bell.seq]


def test_a_lock_not_known_to_be_a_barrier_makes_every_ring_wake(bell):
    """(gevent's patched-in lock is no locked instruction)"""
    wakes = counting_wakes(bell)
    bell._server_asleep[0] = 0
    bell._barrier_is_native = False
    bell.ring(STEP)
    assert wakes == [bell.seq]


class OrderSpy:
    """The barrier, checking the ring's order: req_seq stored before it,
    server_asleep read after it (the spy sets the flag as it passes, so
    only a read after the barrier sees it set)."""

    def __init__(self, bell: Doorbell):
        self.bell, self.passed = bell, 0

    def acquire(self, blocking: bool = True) -> bool:
        assert self.bell._req_seq[0] == self.bell.seq, "the barrier came before the store"
        return True

    def release(self) -> None:
        self.bell._server_asleep[0] = 1
        self.passed += 1


def test_the_ring_stores_then_passes_its_barrier_then_reads_the_flag(bell):
    wakes = counting_wakes(bell)
    bell._server_asleep[0] = 0
    bell._barrier = spy = OrderSpy(bell)
    bell.ring(STEP)
    assert spy.passed == 1 and wakes == [bell.seq]


def test_a_count_refused_by_the_doorbell_leaves_the_ring_unrung(bell):
    """A count the word cannot hold raises before req_seq or seq move, so
    the last request's answer still reads as answered."""
    bell._done[0] = bell.seq  # the last request answered
    with pytest.raises((ValueError, TypeError, OverflowError)):
        bell.ring(SEND, -1)
    assert bell.answered and bell._req_seq[0] == bell.seq


def test_a_quick_answer_is_read_before_wait(bell):
    """quick_answer: an answer published by the time it looks is returned
    (the status, result and index the daemon wrote), and counts as a quick
    sample in wait's estimate; one still out after its turns is None."""
    bell._expected[STEP] = 4e-6
    bell.ring(STEP)
    assert bell.quick_answer() is None  # nobody answers here
    bell._status[0], bell._result[0], bell._error_index[0] = -3, 7, 5
    answer(bell)
    assert bell.quick_answer() == (-3, 7, 5)
    assert bell._expected[STEP] < 4e-6


def test_no_quick_answer_where_answers_take_longer(bell, monkeypatch):
    """A kind answered later than _QUICK_WITHIN_S (a large step, or a client
    sharing its CPU with the daemon's thread) goes straight to wait: no spin
    on done_seq, even for an answer already there."""
    bell._expected[STEP] = doorbell_module._QUICK_WITHIN_S
    monkeypatch.setattr(doorbell_module, "_QUICK_TURNS", None)  # (iterating it would raise)
    bell.ring(STEP)
    answer(bell)
    assert bell.quick_answer() is None
    assert bell.wait(far_deadline(), lambda: None) == (0, 0, 0)
