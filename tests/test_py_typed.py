"""PEP 561: the installed envd package carries its py.typed marker (package
data in pyproject.toml), so type checkers use envd's own type hints."""
from __future__ import annotations

import importlib.metadata
import importlib.resources
from pathlib import Path

import envd


def test_installed_package_has_py_typed():
    marker = importlib.resources.files("envd") / "py.typed"
    assert marker.is_file(), f"no py.typed next to {envd.__file__}"
    # the installed distribution lists it (pip installed it; not just a checkout's file)
    files = importlib.metadata.distribution("envd-rl").files or []
    assert any(Path(str(f)).as_posix() == "envd/py.typed" for f in files), \
        "py.typed is not in the installed distribution's RECORD"
