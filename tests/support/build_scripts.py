"""native/<name>.py build scripts (build_checks, build_warnings, ...) as
modules: they belong to the checkout, not to the installed package, and
setup.py runs them by path, so the tests load them from their files too."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load_build_script(name: str) -> ModuleType:
    """native/<name>.py, loaded from its file as envd_<name>."""
    spec = importlib.util.spec_from_file_location(f"envd_{name}", ROOT / "native" / f"{name}.py")
    assert spec is not None and spec.loader is not None, name
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
