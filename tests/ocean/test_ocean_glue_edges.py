"""ocean_glue.h's refusals and its cleanup of a failed init, on a made-up
env (ocean_glue_edges.c): no real manifest reaches them inside its ranges;
and its episode ends with and without my_log, on made-up my_logs that copy
the Log's fields or compute from them (ocean_log_copies.c)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from envd.native import ocean_build

HERE = Path(__file__).resolve().parent
GLUE = Path(ocean_build.__file__).resolve().parent / "ocean"


def _run_sanitized(source: str, out: Path, *defines: str) -> str:
    """source compiled with the glue as envd ocean build compiles a unit, under
    ASan and UBSan, and run; its stdout."""
    subprocess.run(["gcc", "-O1", "-g", "-fsanitize=address,undefined,float-cast-overflow",
                    "-fno-sanitize-recover=all", *defines,
                    "-include", str(GLUE / "ocean_random.h"),
                    "-I", str(HERE / "glue_edges"), "-I", str(GLUE), "-I", str(GLUE / "python"),
                    "-I", str(ocean_build.envd_include()), str(HERE / source),
                    "-o", str(out), "-lm", "-lpthread"], check=True)
    proc = subprocess.run([str(out)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "ASAN_OPTIONS": "detect_leaks=1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    return proc.stdout


def test_the_glue_refuses_huge_layouts_and_frees_a_failed_init(tmp_path):
    assert "glue edges: ok" in _run_sanitized("ocean_glue_edges.c", tmp_path / "glue_edges")


# 0: my_log copies the Log's floats (read without my_log); 1-7: it scales,
# offsets, takes the absolute value, clamps, adds, records a constant, or
# records a field only for some values; 8-11: it combines fields with small
# integer coefficients; 12: it writes a rate into the Log, then records it
# (my_log kept); every kind also with n in (0, 1), beyond 2^31, inf, <= 0, NaN
@pytest.mark.parametrize("kind", range(13))
def test_episode_ends_equal_vec_log_with_and_without_my_log(kind, tmp_path):
    out = _run_sanitized("ocean_log_copies.c", tmp_path / "log_copies", f"-DLOG_KIND={kind}")
    assert "log copies: ok" in out
