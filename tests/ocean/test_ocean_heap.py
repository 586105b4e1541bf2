"""Every Ocean manifest's heap_bytes bounds what one env allocates itself.

The daemon counts num_envs x heap_bytes against --max-state-bytes, so the
manifest's figure must be an upper bound of what the env's own code
allocates (init, reset, step), yet near it (else the bound refuses makes it
need not).  ocean_heap_run.c measures one env instance with glibc's
mallinfo2 at every make kwarg's default, minimum and maximum: the measure is
the env's real allocations, independent of the manifests' formulas.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import ocean_cases
import puffer_reference
import pytest

from envd.native import ocean_build

STEPS = {"snake": 60, "terraform": 150}
SLACK = 64 * 1024


@pytest.fixture(scope="module")
def heap_runner() -> Path:
    source = Path(__file__).resolve().parent / "ocean_heap_run.c"
    out = puffer_reference.test_cache() / "ocean_heap_run"
    subprocess.run(["gcc", "-O1", "-I", str(ocean_build.envd_include()), str(source), "-o",
                    str(out), "-ldl"], check=True)
    return out


@pytest.mark.parametrize("ends", ["defaults", "min", "max"])
@pytest.mark.parametrize("env", sorted(ocean_cases.ALL))
def test_heap_bytes_bounds_what_one_env_allocates(env, ends, heap_runner, ocean_builds):
    library = ocean_builds(env)
    proc = subprocess.run([str(heap_runner), str(library), ends, str(STEPS.get(env, 400))],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    found = re.search(r"heap: estimate=(\d+) measured=(\d+)", proc.stdout)
    assert found, proc.stdout
    estimate, measured = int(found[1]), int(found[2])
    assert measured <= estimate <= 4 * measured + SLACK, (env, ends, estimate, measured)
