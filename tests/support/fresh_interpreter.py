"""Checks run in a fresh interpreter: loading a plugin changes a process's
env registry for good, and other tests compare that registry with the
built-ins, so the in-process checks of a test plugin run in a child Python
(plugin_checks, multi_agent_checks, multi_spaces_checks)."""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

#: the tests/ folder, put first on the child's sys.path ("from support import ...")
TESTS = Path(__file__).resolve().parents[1]


def checker(module: str) -> Callable[..., str]:
    """run_check(name, *args, timeout=120, env=None) of support.<module>:
    run <module>.<name>(*args) in a fresh interpreter (from "/", env: extra
    environment variables, e.g. support.sanitized_build.sanitized_env), fail
    with its output, return its stderr."""

    def run_check(name: str, *args: str, timeout: float = 120,
                  env: dict[str, str] | None = None) -> str:
        code = (f"import sys; sys.path.insert(0, {str(TESTS)!r}); "
                f"from support import {module}; {module}.{name}(*sys.argv[1:])")
        proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                              text=True, timeout=timeout, cwd="/",
                              env={**os.environ, **(env or {})})
        assert proc.returncode == 0, f"{name}{args} failed:\n{proc.stdout}\n{proc.stderr}"
        return proc.stderr

    run_check.__doc__ = f"Run {module}.<name>(*args) in a fresh interpreter (see checker)."
    return run_check
