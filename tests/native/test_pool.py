"""The thread pool (native/src/pool.c): the C stress program pool_stress.c run
plain, under ThreadSanitizer and under AddressSanitizer + UBSan (LeakSanitizer
included), plus simple API checks through ctypes."""
from __future__ import annotations

import ctypes
import os
import select
import threading
import time
from pathlib import Path

import cbuild
import pytest

STRESS = Path(__file__).resolve().parent / "pool_stress.c"
CODES = cbuild.ERROR_CODES

# Loop divisors keep each run to a few seconds on a loaded 2-core machine.
DIVISORS = {"plain": 1, "tsan": 5, "asan": 4}


@pytest.mark.parametrize("kind", list(DIVISORS))
def test_pool_stress(kind):
    cbuild.run_stress(["pool.c", STRESS], "pool_stress", kind, DIVISORS[kind], timeout=180)


# ---- ctypes -------------------------------------------------------------------------
TASK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
Job = ctypes.c_int64 * 16  # larger than envd_job_t, 8-byte aligned, zeroed


@pytest.fixture(scope="module")
def lib():
    lib = cbuild.load(["pool.c"])
    pool_p = ctypes.POINTER(ctypes.c_void_p)
    lib.envd_pool_create.argtypes = [pool_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    lib.envd_pool_destroy.argtypes = [ctypes.c_void_p]
    lib.envd_pool_destroy.restype = None
    lib.envd_pool_num_threads.argtypes = [ctypes.c_void_p]
    lib.envd_pool_eventfd.argtypes = [ctypes.c_void_p]
    lib.envd_pool_submit.argtypes = [ctypes.c_void_p, ctypes.c_void_p, TASK, ctypes.c_void_p,
                                     ctypes.c_int64, ctypes.c_int64, ctypes.c_int]
    lib.envd_pool_wait.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.envd_pool_wait.restype = None
    lib.envd_pool_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, TASK, ctypes.c_void_p,
                                  ctypes.c_int64, ctypes.c_int64]
    lib.envd_job_done.argtypes = [ctypes.c_void_p]
    lib.envd_job_set_cap.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    return lib


def make_pool(lib, threads):
    pool = ctypes.c_void_p()
    assert lib.envd_pool_create(ctypes.byref(pool), threads, None) == 0
    return pool


def recorder():
    """A task that records its ranges (list.append is atomic under the GIL)."""
    ranges = []
    return ranges, TASK(lambda ctx, begin, end: ranges.append((begin, end)))


def read_eventfd_total(fd, want, timeout=10.0):
    total = 0
    while total < want and select.select([fd], [], [], timeout)[0]:
        total += int.from_bytes(os.read(fd, 8), "little")
    return total


def test_bad_arguments(lib):
    einval = CODES["ENVD_EINVAL"]
    pool = ctypes.c_void_p()
    assert lib.envd_pool_create(None, 1, None) == einval
    assert lib.envd_pool_create(ctypes.byref(pool), -1, None) == einval
    assert lib.envd_pool_create(ctypes.byref(pool), 257, None) == einval
    cpus = (ctypes.c_int * 1)(-3)
    assert lib.envd_pool_create(ctypes.byref(pool), 1, cpus) == einval
    pool = make_pool(lib, 1)
    job = Job()
    _, task = recorder()
    assert lib.envd_pool_submit(pool, job, task, None, -1, 1, 0) == einval
    assert lib.envd_pool_submit(pool, job, task, None, 4, 0, 0) == einval
    assert lib.envd_pool_submit(pool, job, task, None, 4, 1, 8) == einval
    assert lib.envd_pool_submit(pool, None, task, None, 4, 1, 0) == einval
    assert lib.envd_pool_submit(None, job, task, None, 4, 1, 0) == einval
    assert lib.envd_pool_submit(pool, job, TASK(), None, 4, 1, 0) == einval
    lib.envd_pool_destroy(pool)


def test_zero_threads_runs_inline(lib):
    pool = make_pool(lib, 0)
    assert lib.envd_pool_num_threads(pool) == 0
    job = Job()
    ranges, task = recorder()
    assert lib.envd_pool_submit(pool, job, task, None, 10, 4, 1) == 0
    assert lib.envd_job_done(job)
    assert ranges == [(0, 4), (4, 8), (8, 10)]
    assert read_eventfd_total(lib.envd_pool_eventfd(pool), 1, timeout=0) == 1
    lib.envd_pool_destroy(pool)


def test_eventfd_counts_notify_jobs(lib):
    pool = make_pool(lib, 2)
    jobs = [Job() for _ in range(8)]
    ranges, task = recorder()
    for i, job in enumerate(jobs):
        assert lib.envd_pool_submit(pool, job, task, None, 5, 2, 1 if i % 2 else 0) == 0
    for job in jobs:
        lib.envd_pool_wait(pool, job)
        assert lib.envd_job_done(job)
    assert sorted(ranges) == sorted([(0, 2), (2, 4), (4, 5)] * 8)
    fd = lib.envd_pool_eventfd(pool)
    assert read_eventfd_total(fd, 4) == 4
    assert not select.select([fd], [], [], 0.05)[0]  # nothing counted for plain jobs
    lib.envd_pool_destroy(pool)


def test_busy_job_is_refused(lib):
    pool = make_pool(lib, 1)
    started, release = threading.Event(), threading.Event()

    def blocking(ctx, begin, end):
        started.set()
        release.wait(10)

    task = TASK(blocking)
    job = Job()
    assert lib.envd_pool_submit(pool, job, task, None, 1, 1, 0) == 0
    assert started.wait(10)
    assert lib.envd_pool_submit(pool, job, task, None, 1, 1, 0) == CODES["ENVD_EBUSY"]
    assert not lib.envd_job_done(job)
    release.set()
    lib.envd_pool_wait(pool, job)
    assert lib.envd_pool_run(pool, job, task, None, 3, 1) == 0
    lib.envd_pool_destroy(pool)


class Cap(ctypes.Structure):
    """envd_pool_cap_t."""
    _fields_ = [("max_workers", ctypes.c_int), ("active", ctypes.c_int)]


def test_cap_refused_while_in_flight_and_below_one_worker(lib):
    pool = make_pool(lib, 2)
    started, release = threading.Event(), threading.Event()

    def blocking(ctx, begin, end):
        started.set()
        release.wait(10)

    task = TASK(blocking)
    job, cap = Job(), Cap(max_workers=1)
    assert lib.envd_job_set_cap(job, ctypes.byref(Cap(max_workers=0))) == CODES["ENVD_EINVAL"]
    assert lib.envd_job_set_cap(job, ctypes.byref(cap)) == 0
    assert lib.envd_pool_submit(pool, job, task, None, 1, 1, 0) == 0
    assert started.wait(10)
    assert cap.active == 1  # the worker running the chunk holds the cap's one slot
    assert lib.envd_job_set_cap(job, None) == CODES["ENVD_EBUSY"]
    release.set()
    lib.envd_pool_wait(pool, job)
    assert cap.active == 0
    assert lib.envd_job_set_cap(job, None) == 0
    lib.envd_pool_destroy(pool)


def _thread_ids() -> set[int]:
    return {int(tid) for tid in os.listdir("/proc/self/task")}


def _in_a_thread(work):
    """work()'s result, run on a new thread (a policy set there stays there)."""
    out = []
    thread = threading.Thread(target=lambda: out.append(work()))
    thread.start()
    thread.join()
    return out[0]


def _may_take(policy: int) -> bool:
    """Whether this sandbox lets a thread take policy (a throwaway thread tries)."""
    def attempt() -> bool:
        try:
            os.sched_setscheduler(0, policy, os.sched_param(0))
            return True
        except OSError:
            return False
    return _in_a_thread(attempt)


def _worker_policies(workers: set[int], want: int) -> set[int]:
    # (each worker sets its policy as it starts: wait for them, generously)
    deadline = time.monotonic() + 30
    while {os.sched_getscheduler(tid) for tid in workers} != {want} \
            and time.monotonic() < deadline:
        time.sleep(0.01)
    return {os.sched_getscheduler(tid) for tid in workers}


def test_workers_run_under_sched_batch(lib):
    """A worker woken by a submit must not preempt the submitting thread
    (an async send then returned only after the worker had stepped much of
    its batch): workers run under SCHED_BATCH; the creating thread keeps its
    policy."""
    if os.sched_getscheduler(0) != os.SCHED_OTHER or not _may_take(os.SCHED_BATCH):
        pytest.skip("the workers take SCHED_BATCH only from SCHED_OTHER, where the "
                    "sandbox allows it (best effort: the pool runs without it)")
    before = _thread_ids()
    pool = make_pool(lib, 2)
    try:
        workers = _thread_ids() - before
        assert len(workers) == 2
        assert _worker_policies(workers, os.SCHED_BATCH) == {os.SCHED_BATCH}
        assert os.sched_getscheduler(0) == os.SCHED_OTHER
    finally:
        lib.envd_pool_destroy(pool)


def test_workers_keep_the_operators_policy(lib):
    """Workers created by a thread under SCHED_IDLE (chrt -i, systemd's
    CPUSchedulingPolicy=idle) stay under SCHED_IDLE: SCHED_BATCH replaces
    SCHED_OTHER only."""
    if not _may_take(os.SCHED_IDLE):
        pytest.skip("this sandbox refuses SCHED_IDLE")

    def make_idle_pool() -> tuple[object, set[int]]:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        before = _thread_ids()
        pool = make_pool(lib, 2)
        return pool, _thread_ids() - before

    pool, workers = _in_a_thread(make_idle_pool)
    try:
        assert len(workers) == 2
        assert _worker_policies(workers, os.SCHED_IDLE) == {os.SCHED_IDLE}
    finally:
        lib.envd_pool_destroy(pool)
