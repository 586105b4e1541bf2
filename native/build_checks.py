"""What a source build of envd needs, checked before anything compiles, so a
machine that lacks it gets one line saying what to do instead of a compiler's
or setuptools' traceback.  setup.py calls check_build_machine() first.

- Linux: the native core uses Linux futexes, eventfd and /dev/shm (shared
  memory with the daemon), so it neither builds nor runs elsewhere.
- A C compiler: the one setuptools and native/build_ffi.py will call, $CC or
  Python's configured CC (sysconfig), found on PATH.
- Python's headers (Python.h): cffi's API mode compiles against them.
"""
from __future__ import annotations

import os
import shlex
import shutil
import sys
import sysconfig
from collections.abc import Mapping

#: The way around a missing compiler: a wheel installs without one (README,
#: "Packaging and the documentation site").
_WHEEL_HINT = "or install an envd-rl wheel built where gcc is (`pip wheel .`)"


class BuildMachineError(SystemExit):
    """A source build cannot work on this machine; str() is the one line."""

    def __init__(self, message: str) -> None:
        super().__init__(f"envd: {message}")


def check_platform(platform: str | None = None) -> None:
    """Refuse a platform other than Linux (default: this one, sys.platform)."""
    platform = sys.platform if platform is None else platform
    if not platform.startswith("linux"):
        raise BuildMachineError(
            f"envd runs on Linux only (its native core uses Linux futexes, eventfd and "
            f"/dev/shm); this is {platform!r}: use a Linux machine, VM or container")


def compiler_command(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The C compiler command the build will run: $CC, else Python's CC."""
    return shlex.split(environ.get("CC") or sysconfig.get_config_var("CC") or "cc")


def check_compiler(environ: Mapping[str, str] = os.environ) -> None:
    """Refuse a build whose C compiler is not there (looked up on environ's PATH)."""
    command = compiler_command(environ)
    program = command[0] if command else ""
    if program and shutil.which(program, path=environ.get("PATH", os.defpath)):
        return
    source = "$CC" if environ.get("CC") else "Python's configured compiler"
    raise BuildMachineError(
        f"no C compiler found: {program!r} ({source}) is not on PATH; building envd from "
        f"source compiles its native core: install gcc (Debian/Ubuntu: `apt install gcc "
        f"python3-dev`) or set CC to a C compiler, {_WHEEL_HINT}")


def check_headers(include_dir: str | None = None) -> None:
    """Refuse a build without Python.h (cffi compiles against it)."""
    include_dir = include_dir or sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include_dir, "Python.h")):
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        raise BuildMachineError(
            f"Python's headers are missing ({include_dir}/Python.h): install them "
            f"(Debian/Ubuntu: `apt install python{version}-dev`), {_WHEEL_HINT}")


def check_build_machine(argv: list[str] | None = None) -> None:
    """Every check setup.py runs: the platform always; the compiler and the
    headers unless the command (argv, default sys.argv) only packs an sdist,
    which compiles nothing."""
    argv = sys.argv if argv is None else argv
    check_platform()
    if argv[1:] and all(arg == "sdist" or arg.startswith("-") for arg in argv[1:]):
        return
    check_compiler()
    check_headers()
