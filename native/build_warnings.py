"""Warnings are errors in envd's own C, in every build of it.

The package build (setup.py, through cffi) compiles native/src's C files (and
native/capi's CPython extension) with
the warning set of the test builds (tests/native/cbuild.py): ``-Wall -Wextra
-Werror``, so a warning fails ``pip install .`` as it fails the tests.  Not
covered: the wrapper cffi generates (its code is cffi's and Python's headers',
not envd's: it gets no warning flags, although it compiles clean with them
under gcc 12), PufferLib's Ocean units (native/ocean_build.py) and users'
plugins.

A compiler newer than the ones CI uses may warn about code that was clean:
packagers who build with one set ``ENVD_NO_WERROR=1``, which keeps the
warnings (printed) and drops ``-Werror`` (docs/configuration.md, "Building
from source").
"""
from __future__ import annotations

import os
from pathlib import Path

#: the environment variable that turns the errors back into warnings
NO_WERROR = "ENVD_NO_WERROR"
#: envd's own C files: every file under native/src and native/capi
OWN_SOURCES = (Path(__file__).resolve().parent / "src", Path(__file__).resolve().parent / "capi")


def warning_flags() -> list[str]:
    """The warning flags of envd's own C files."""
    flags = ["-Wall", "-Wextra"]
    if os.environ.get(NO_WERROR, "") in ("", "0"):
        flags.append("-Werror")
    return flags


def is_own_source(path: str | os.PathLike) -> bool:
    """Whether path is one of envd's own C files."""
    resolved = Path(path).resolve()
    return any(resolved.is_relative_to(folder) for folder in OWN_SOURCES)


def own_warnings_build_ext(base: type) -> type:
    """A subclass of setuptools' build_ext (base) that compiles envd's own C
    files with warning_flags() and the other sources of an extension (cffi's
    wrapper) as they were."""

    class BuildExt(base):
        def build_extension(self, ext):
            compile_ = self.compiler.compile

            def compile(sources, *args, extra_postargs=None, **kwargs):
                own = [s for s in sources if is_own_source(s)]
                other = [s for s in sources if not is_own_source(s)]
                objects = compile_(other, *args, extra_postargs=extra_postargs, **kwargs)
                return objects + compile_(
                    own, *args, extra_postargs=[*(extra_postargs or []), *warning_flags()],
                    **kwargs)

            self.compiler.compile = compile
            try:
                super().build_extension(ext)
            finally:
                del self.compiler.compile  # the instance attribute: back to the class's

    return BuildExt
