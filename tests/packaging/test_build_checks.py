"""A machine that cannot build envd from source gets one line saying why,
before anything compiles (native/build_checks.py, called first by setup.py):
not Linux, no C compiler (a $CC that is not there, or a PATH without gcc),
no Python headers.  The checks are unit-tested here by handing them another
platform and another environment; setup.py is run as pip runs it, with the
compiler taken away, to show the one line comes out of a real build.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.build_scripts import load_build_script

ROOT = Path(__file__).resolve().parents[2]


checks = load_build_script("build_checks")


@pytest.mark.parametrize("platform", ["darwin", "win32", "freebsd14", "cygwin"])
def test_other_platforms_are_refused_in_one_line(platform):
    with pytest.raises(SystemExit) as exc:
        checks.check_platform(platform)
    message = str(exc.value)
    assert "\n" not in message and "Linux only" in message and repr(platform) in message


def test_linux_passes():
    checks.check_platform("linux")


def test_the_platform_check_reads_sys_platform(monkeypatch):
    """setup.py calls check_build_machine() with no arguments: it must look at
    the real sys.platform (here made macOS's)."""
    monkeypatch.setattr(sys, "platform", "darwin")
    with pytest.raises(SystemExit, match="Linux only"):
        checks.check_build_machine(["setup.py", "sdist"])


def test_a_missing_cc_is_named(tmp_path):
    environ = {"CC": str(tmp_path / "nonexistent-cc"), "PATH": os.environ["PATH"]}
    with pytest.raises(SystemExit) as exc:
        checks.check_compiler(environ)
    message = str(exc.value)
    assert "\n" not in message and "no C compiler" in message and "nonexistent-cc" in message
    assert "$CC" in message


def test_a_path_without_the_compiler_is_refused(tmp_path):
    """No CC: Python's configured compiler (gcc here), looked for on a PATH
    that holds no compiler."""
    with pytest.raises(SystemExit, match="no C compiler found.*Python's configured compiler"):
        checks.check_compiler({"PATH": str(tmp_path)})


def test_the_compiler_of_this_machine_is_found():
    checks.check_compiler(os.environ)
    checks.check_headers()


def test_missing_headers_are_named(tmp_path):
    with pytest.raises(SystemExit, match="Python's headers are missing"):
        checks.check_headers(str(tmp_path))


def test_an_sdist_needs_no_compiler(monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    checks.check_build_machine(["setup.py", "sdist", "--formats=gztar"])
    with pytest.raises(SystemExit, match="no C compiler"):
        checks.check_build_machine(["setup.py", "bdist_wheel"])


def test_setup_py_stops_in_one_line_without_a_compiler(tmp_path):
    """setup.py as pip's build backend runs it (egg_info first), with CC
    naming no program: exit status 1 and the one line on stderr, nothing
    compiled or written."""
    env = {**os.environ, "CC": str(tmp_path / "no-such-cc")}
    before = sorted(p.name for p in ROOT.iterdir())
    result = subprocess.run([sys.executable, "setup.py", "egg_info", "--egg-base", str(tmp_path)],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        line for line in result.stderr.strip().splitlines() if line.startswith("envd: no C compiler")]
    assert "no-such-cc" in result.stderr and "Traceback" not in result.stderr
    assert sorted(p.name for p in ROOT.iterdir()) == before
