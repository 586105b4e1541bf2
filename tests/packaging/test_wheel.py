"""The binary wheel CI builds (.ci/run; its path in ENVD_WHEEL): what it
carries, and that it installs and works on a machine without a C compiler
(tests/packaging/wheel_smoke.sh).

Without ENVD_WHEEL these tests skip on a developer's machine, saying how to
run them, and fail under CI=true: CI must not pass without the wheel.
"""
from __future__ import annotations

import os
import re
import subprocess
import zipfile
from pathlib import Path

import pytest

import envd

SMOKE = Path(__file__).resolve().parent / "wheel_smoke.sh"
ON_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="module")
def wheel() -> Path:
    value = os.environ.get("ENVD_WHEEL")
    if not value:
        reason = ("ENVD_WHEEL is not set (build a wheel: pip wheel . --no-deps -w dist/, "
                  "then ENVD_WHEEL=dist/envd_rl-....whl pytest tests/packaging)")
        if ON_CI:
            pytest.fail(f"CI=true but {reason}")
        pytest.skip(reason)
    path = Path(value)
    assert path.is_file(), f"ENVD_WHEEL={value} is not a file"
    return path


def test_wheel_carries_the_package_the_native_core_and_py_typed(wheel: Path):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(f"{dist_info}/METADATA").decode()
        entry_points = archive.read(f"{dist_info}/entry_points.txt").decode()
        wheel_info = archive.read(f"{dist_info}/WHEEL").decode()
    assert re.search(r"^Name: envd-rl$", metadata, re.M), "the distribution must be envd-rl"
    assert re.search(rf"^Version: {re.escape(envd.__version__)}$", metadata, re.M)
    assert "envd/py.typed" in names
    assert "envd/native/include/envd.h" in names  # plugins compile against the installed header
    # the facts generated from the C headers at build time (native/build_ffi.py), git-ignored
    assert "envd/_native_facts.py" in names, "the wheel lacks the generated envd/_native_facts.py"
    assert any(re.fullmatch(r"envd/native/_envd_native\..*\.so", n) for n in names), \
        "no compiled native core in the wheel"
    # the in-process step's bound call (native/capi/bound_call.c), on the same limited API
    assert "envd/native/_envd_call.abi3.so" in names, "the wheel lacks envd/native/_envd_call"
    assert not [n for n in names if n.endswith(".c")], "C sources belong in the sdist only"
    for package in ("envd", "envd/client", "envd/server", "envd/native", "envd/integrations",
                    "envd/tools"):
        assert f"{package}/__init__.py" in names, f"{package} missing"
    assert re.search(r"^envd = envd\.tools\.cli:main$", entry_points, re.M), entry_points
    tags = re.findall(r"^Tag: (\S+)$", wheel_info, re.M)
    assert tags and all(not t.endswith("-any") for t in tags), f"not a binary wheel: {tags}"
    if ON_CI:  # CI repairs the wheel with auditwheel
        assert all(re.search(r"-manylinux_\d+_\d+_\w+$", t) for t in tags), \
            f"CI's wheel is not manylinux-tagged: {tags}"


def _pythons() -> list[str]:
    """python3, plus the interpreters in ENVD_WHEEL_PYTHONS (":"-separated;
    .ci/run names the oldest Python the cp310-abi3 wheel claims, where installed)."""
    extra = [p for p in os.environ.get("ENVD_WHEEL_PYTHONS", "").split(":") if p]
    return ["python3", *extra]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("python", _pythons())
def test_wheel_installs_and_runs_without_a_compiler(wheel: Path, python: str):
    done = subprocess.run(["bash", str(SMOKE), str(wheel)], capture_output=True, text=True,
                          timeout=880, check=False, env={**os.environ, "PYTHON": python})
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"wheel_smoke.sh failed ({done.returncode}):\n{output}"
    for step in ("no compiler on PATH", "in-process step ok", "envd.h installed", "daemon up",
                 "client step through the daemon ok", "wheel_smoke: ok"):
        assert step in done.stdout, f"{step!r} missing from the smoke test's output:\n{output}"
