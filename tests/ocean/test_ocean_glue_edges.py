"""ocean_glue.h's refusals and its cleanup of a failed init, on a made-up
env (ocean_glue_edges.c): no real manifest reaches them inside its ranges."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from envd.native import ocean_build

HERE = Path(__file__).resolve().parent
GLUE = Path(ocean_build.__file__).resolve().parent / "ocean"


def test_the_glue_refuses_huge_layouts_and_frees_a_failed_init(tmp_path):
    out = tmp_path / "glue_edges"
    subprocess.run(["gcc", "-O1", "-g", "-fsanitize=address,undefined",
                    "-fno-sanitize-recover=all", "-include", str(GLUE / "ocean_random.h"),
                    "-I", str(HERE / "glue_edges"), "-I", str(GLUE), "-I", str(GLUE / "python"),
                    "-I", str(ocean_build.envd_include()), str(HERE / "ocean_glue_edges.c"),
                    "-o", str(out), "-lm", "-lpthread"], check=True)
    proc = subprocess.run([str(out)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "ASAN_OPTIONS": "detect_leaks=1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert "glue edges: ok" in proc.stdout
