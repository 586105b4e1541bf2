"""The vec layer (native/src/vec.c): the C program vec_stress.c, which checks
determinism across thread counts, chunk sizes and autoreset modes, the split
submit/done/finish API, error paths and env callback failures, run plain,
under ThreadSanitizer and under AddressSanitizer + UBSan (LeakSanitizer
included)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

import cbuild

STRESS = Path(__file__).resolve().parent / "vec_stress.c"
SOURCES = (["vec.c", "pool.c", "rng.c", "errors.c", "builtin_envs.c", "npy_f32_trig.c"]
           + sorted(str(p) for p in (cbuild.SRC / "envs").glob("*.c")) + [STRESS])
SANITIZER_REPORTS = ("WARNING: ThreadSanitizer", "ERROR: AddressSanitizer",
                     "ERROR: LeakSanitizer", "runtime error")

# (flags, loop divisor, environment): the divisors keep each run within tens
# of seconds on a loaded 2-core machine; TSAN is the slowest per step.
BUILDS = {
    "plain": ([], 1, {}),
    "tsan": (["-fsanitize=thread", "-g", "-O1"], 2,
             {"TSAN_OPTIONS": "halt_on_error=1:second_deadlock_stack=1"}),
    "asan": (["-fsanitize=address,undefined", "-fno-sanitize-recover=all",
              "-fno-omit-frame-pointer", "-g", "-O1"], 1,
             {"ASAN_OPTIONS": "detect_leaks=1:halt_on_error=1",
              "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"}),
}


@pytest.mark.parametrize("kind", list(BUILDS))
def test_vec_stress(kind):
    flags, divisor, env = BUILDS[kind]
    exe = cbuild.build(SOURCES, flags, shared=False, name=f"vec_stress_{kind}")
    proc = subprocess.run([str(exe), str(divisor)], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=300)
    report = f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-8000:]}"
    assert proc.returncode == 0, report
    assert not any(s in proc.stderr for s in SANITIZER_REPORTS), report
    assert "vec_stress: ok" in proc.stdout, report
