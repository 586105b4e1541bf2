"""Warnings are errors in envd's own C in the package build (native/build_warnings.py,
setup.py's build_ext), and only there: cffi's wrapper keeps the flags it had,
and ENVD_NO_WERROR=1 lets a newer compiler's warnings pass.

Compiles two small C files with the real setuptools build_ext: one counted as
envd's own (under the module's OWN_SOURCES, pointed at a temporary folder),
one not, each with the same warning."""
from __future__ import annotations

from pathlib import Path

import pytest
from setuptools import Distribution, Extension
from setuptools.command.build_ext import build_ext
from setuptools.errors import CompileError
from support.build_scripts import load_build_script

ROOT = Path(__file__).resolve().parents[2]


bw = load_build_script("build_warnings")
# an unused variable: -Wall warns about it (-Wunused-variable)
WARNS = "int envd_test_{name}(void) {{ int unused; return 0; }}\n"
CLEAN = "int envd_test_{name}(void) {{ return 0; }}\n"


@pytest.mark.parametrize("value, werror", [(None, True), ("", True), ("0", True), ("1", False),
                                           ("yes", False)])
def test_warning_flags(monkeypatch, value, werror):
    if value is None:
        monkeypatch.delenv(bw.NO_WERROR, raising=False)
    else:
        monkeypatch.setenv(bw.NO_WERROR, value)
    flags = bw.warning_flags()
    assert flags[:2] == ["-Wall", "-Wextra"]
    assert ("-Werror" in flags) is werror


def test_the_package_builds_envd_sources_with_the_test_builds_warnings():
    """cbuild's flags (the test builds') hold the same warning set."""
    cbuild = (ROOT / "tests" / "native" / "cbuild.py").read_text()
    for flag in ("-Wall", "-Wextra", "-Werror"):
        assert f'"{flag}"' in cbuild
    assert bw.is_own_source(ROOT / "native" / "src" / "vec.c")
    assert not bw.is_own_source(ROOT / "build" / "temp" / "_envd_native.c")
    assert not bw.is_own_source(ROOT / "native" / "ocean" / "env_binding.h")


def _build(tmp_path: Path, own: str, other: str) -> None:
    (tmp_path / "own").mkdir(exist_ok=True)
    (tmp_path / "own" / "own.c").write_text(own.format(name="own"))
    (tmp_path / "wrapper.c").write_text(other.format(name="other"))
    sources = [str(tmp_path / "wrapper.c"), str(tmp_path / "own" / "own.c")]
    dist = Distribution({"name": "warnings_probe",
                         "ext_modules": [Extension("warnings_probe", sources)]})
    command = bw.own_warnings_build_ext(build_ext)(dist)
    command.build_temp = str(tmp_path / "temp")
    command.build_lib = str(tmp_path / "lib")
    command.ensure_finalized()
    command.run()


@pytest.fixture
def own_sources(tmp_path, monkeypatch):
    monkeypatch.setattr(bw, "OWN_SOURCES", (tmp_path / "own",))
    monkeypatch.delenv(bw.NO_WERROR, raising=False)
    return tmp_path


def test_a_warning_in_envd_own_c_fails_the_build(own_sources):
    with pytest.raises(CompileError):
        _build(own_sources, WARNS, CLEAN)


def test_a_warning_in_the_wrapper_does_not(own_sources):
    _build(own_sources, CLEAN, WARNS)
    assert list((own_sources / "lib").glob("warnings_probe*.so"))


def test_envd_no_werror_lets_envd_own_warnings_pass(own_sources, monkeypatch):
    monkeypatch.setenv(bw.NO_WERROR, "1")
    _build(own_sources, WARNS, CLEAN)
    assert list((own_sources / "lib").glob("warnings_probe*.so"))
