"""The Ocean adapter under the sanitizers.

ASan and UBSan, at both ends of every kwarg range: each env is built by
``envd ocean build``'s own code with -fsanitize=address,undefined and driven
by a sanitized C program (ocean_sanitized_run.c) with every make kwarg at its
default, its minimum and its maximum: the manifest's ranges are envd's
promise that an env runs clean anywhere inside them.

TSan: four envs of each kind stepped by two threads in turns, as envd's pool
steps them (ocean_threads_run.c): the per-env random streams and clocks, and
the envs' own code, must not race.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import ocean_cases
import puffer_reference
import pytest

from envd.native import ocean_build

FLAGS = ("-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer",
         "-g")
ENV = {"ASAN_OPTIONS": "detect_leaks=1:halt_on_error=1",
       "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"}
REPORTS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error")
STEPS = {"snake": 60, "terraform": 150}


TSAN_FLAGS = ("-fsanitize=thread", "-g")
TSAN_ENV = {"TSAN_OPTIONS": "halt_on_error=1:second_deadlock_stack=1"}


def _program(name: str, flags: tuple[str, ...]) -> Path:
    source = Path(__file__).resolve().parent / f"{name}.c"
    out = puffer_reference.test_cache() / name
    subprocess.run(["gcc", "-O1", *flags, "-I", str(ocean_build.envd_include()), str(source),
                    "-o", str(out), "-ldl", "-lpthread"], check=True)
    return out


@pytest.fixture(scope="module")
def runner() -> Path:
    return _program("ocean_sanitized_run", FLAGS)


@pytest.fixture(scope="module")
def threads_runner() -> Path:
    return _program("ocean_threads_run", TSAN_FLAGS)


@pytest.mark.parametrize("ends", ["defaults", "min", "max"])
@pytest.mark.parametrize("env", sorted(ocean_cases.ALL))
def test_env_runs_clean_under_asan(env, ends, runner, ocean_builds):
    library = ocean_builds(env, FLAGS)
    proc = subprocess.run([str(runner), str(library), ends, str(STEPS.get(env, 400))],
                          env={**os.environ, **ENV}, capture_output=True, text=True, timeout=600)
    report = f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-6000:]}"
    assert proc.returncode == 0, report
    assert not any(r in proc.stderr for r in REPORTS), report
    assert "ocean: ok" in proc.stdout, report


@pytest.mark.parametrize("env", sorted(ocean_cases.ALL))
def test_envs_on_two_threads_run_clean_under_tsan(env, threads_runner, ocean_builds):
    library = ocean_builds(env, TSAN_FLAGS)
    proc = subprocess.run([str(threads_runner), str(library), str(STEPS.get(env, 300))],
                          env={**os.environ, **TSAN_ENV}, capture_output=True, text=True,
                          timeout=600)
    report = f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-6000:]}"
    assert proc.returncode == 0, report
    assert "WARNING: ThreadSanitizer" not in proc.stderr, report
    assert "ocean threads: ok" in proc.stdout, report
