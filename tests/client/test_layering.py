"""Imports point downward: the client and the modules it shares with the
daemon never import native code or the daemon (a trainer host needs numpy,
pyzmq, msgpack and gymnasium only), and the daemon never imports the client."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLIENT_SIDE = [*sorted((ROOT / "client").rglob("*.py")),
               *(ROOT / "envd" / name for name in ("protocol.py", "shm.py", "vector_base.py",
                                                   "errors.py", "keys.py"))]
SERVER_SIDE = sorted((ROOT / "server").glob("*.py"))


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", CLIENT_SIDE, ids=lambda p: str(p.relative_to(ROOT)))
def test_client_side_imports_no_native_code_and_no_daemon(path):
    bad = {m for m in imported_modules(path)
           if m.startswith(("envd.native", "envd.server", "cffi", "uvloop"))}
    assert not bad, f"{path.name} imports {sorted(bad)}"


@pytest.mark.parametrize("path", SERVER_SIDE, ids=lambda p: str(p.relative_to(ROOT)))
def test_daemon_does_not_import_the_client(path):
    bad = {m for m in imported_modules(path) if m.startswith("envd.client")}
    assert not bad, f"{path.name} imports {sorted(bad)}"
