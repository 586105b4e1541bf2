"""The request engine (native/src/engine.c): the C program engine_stress.c,
which drives several sessions' steps, sends and recvs through one engine
while the pool's threads end batches (every request completed exactly once,
recv counts within their bounds, every env back), a waiting recv completed
by a failing batch, a session closed while its recv waits, settle requests
and the refusals, two front doors on one session (the loop's submit
and envd_engine_call, the doorbell thread's: the same rules, racing), and
the third, the in-process calls (the session's step, send and recv: the
same rules beside the loop's and a doorbell's requests, racing both; a
close while an in-process recv waits) -- run plain, under ThreadSanitizer
and under AddressSanitizer + UBSan (LeakSanitizer included)."""
from __future__ import annotations

from pathlib import Path

import cbuild
import pytest

STRESS = Path(__file__).resolve().parent / "engine_stress.c"
SOURCES = (["engine.c", "session.c", "backend_pool.c", "vec.c", "env_slot.c", "pool.c", "rng.c", "errors.c",
            "builtin_envs.c", "npy_f32_trig.c", "raster.c"]
           + sorted(str(p) for p in (cbuild.SRC / "envs").glob("*.c")) + [STRESS])
# Loop divisors keep each run within seconds (plain) or tens of seconds
# (sanitizers) on a loaded 2-core machine.
DIVISORS = {"plain": 1, "tsan": 4, "asan": 2}


@pytest.mark.parametrize("kind", list(DIVISORS))
def test_engine_stress(kind):
    cbuild.run_stress(SOURCES, "engine_stress", kind, DIVISORS[kind], timeout=300)
