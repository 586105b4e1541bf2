"""The doorbell thread (native/src/doorbell.c), serving a native session
(session.c): the C program
doorbell_stress.c, in which client threads ring the doorbell as client/doorbell.py
does and check results against twin vecs stepped serially, the error answers,
envd_doorbell_lock and envd_doorbell_trylock, drain, stop (idle, during a request,
with a request rung after stop began, right after an answer -- where a lost
wake-up showed -- and start/stop cycles) and the process-wide spinner bound, run
plain, under ThreadSanitizer and under AddressSanitizer + UBSan (LeakSanitizer
included); and doorbell_alongside.c, when a spin yields from its start, run the
same three ways."""
from __future__ import annotations

from pathlib import Path

import cbuild
import pytest

STRESS = Path(__file__).resolve().parent / "doorbell_stress.c"
SOURCES = (["doorbell.c", "engine.c", "session.c", "backend_pool.c", "vec.c", "env_slot.c", "pool.c", "rng.c",
            "errors.c", "builtin_envs.c", "npy_f32_trig.c", "raster.c"]
           + sorted(str(p) for p in (cbuild.SRC / "envs").glob("*.c")) + [STRESS])
# Loop divisors keep each run within seconds (plain) or tens of seconds
# (sanitizers) on a loaded 2-core machine; TSAN is the slowest per step.
DIVISORS = {"plain": 1, "tsan": 2, "asan": 1}


@pytest.mark.parametrize("kind", list(DIVISORS))
def test_doorbell_stress(kind):
    cbuild.run_stress(SOURCES, "doorbell_stress", kind, DIVISORS[kind], timeout=300)


ALONGSIDE = Path(__file__).resolve().parent / "doorbell_alongside.c"


@pytest.mark.parametrize("kind", list(DIVISORS))
def test_spin_yields_from_its_start_only_while_its_client_shares_the_cpu(kind):
    """doorbell_alongside.c: the server thread's clock and yields scripted
    (the program defines clock_gettime and sched_yield for it), so that a
    client ringing from another CPU after one that shared the CPU is seen
    the same way on any machine, however loaded."""
    cbuild.run_stress(SOURCES[:-1] + [ALONGSIDE], "doorbell_alongside", kind, 1, timeout=300)
