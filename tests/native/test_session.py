"""The native session (native/src/session.c): the C program session_stress.c,
which checks the async books (exact recv counts, exactly-once, ready order,
bit-identity with a serial twin, the bound on reusable batches), the
refusals with a batch held in flight, a failing env, async_reset dropping
what is in flight, the doorbell served while other callers take the
session's lock, and a bound call's short step that never waits (for that
lock, or for the pool under a forced chunk) -- run plain, under ThreadSanitizer and under AddressSanitizer
+ UBSan (LeakSanitizer included)."""
from __future__ import annotations

from pathlib import Path

import cbuild
import pytest

STRESS = Path(__file__).resolve().parent / "session_stress.c"
SOURCES = (["session.c", "backend_pool.c", "doorbell.c", "engine.c", "vec.c", "env_slot.c", "pool.c",
            "rng.c", "errors.c", "builtin_envs.c", "npy_f32_trig.c", "raster.c"]
           + sorted(str(p) for p in (cbuild.SRC / "envs").glob("*.c")) + [STRESS])
# Loop divisors keep each run within seconds (plain) or tens of seconds
# (sanitizers) on a loaded 2-core machine.
DIVISORS = {"plain": 1, "tsan": 4, "asan": 2}


@pytest.mark.parametrize("kind", list(DIVISORS))
def test_session_stress(kind):
    cbuild.run_stress(SOURCES, "session_stress", kind, DIVISORS[kind], timeout=300)
