"""The vec layer (native/src/vec.c): the C program vec_stress.c, which checks
determinism across thread counts, chunk sizes and autoreset modes, the split
submit/done/finish API, error paths and env callback failures, run plain,
under ThreadSanitizer and under AddressSanitizer + UBSan (LeakSanitizer
included)."""
from __future__ import annotations

from pathlib import Path

import cbuild
import pytest

STRESS = Path(__file__).resolve().parent / "vec_stress.c"
SOURCES = (["vec.c", "env_slot.c", "pool.c", "rng.c", "errors.c", "builtin_envs.c", "npy_f32_trig.c", "raster.c"]
           + sorted(str(p) for p in (cbuild.SRC / "envs").glob("*.c")) + [STRESS])
# Loop divisors keep each run within tens of seconds on a loaded 2-core
# machine; TSAN is the slowest per step.
DIVISORS = {"plain": 1, "tsan": 2, "asan": 1}


@pytest.mark.parametrize("kind", list(DIVISORS))
def test_vec_stress(kind):
    cbuild.run_stress(SOURCES, "vec_stress", kind, DIVISORS[kind], timeout=300)
