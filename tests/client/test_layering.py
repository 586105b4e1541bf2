"""Imports point downward: the client and the modules it shares with the
daemon never import native code or the daemon (a trainer host needs numpy,
pyzmq, msgpack and gymnasium only), the daemon never imports the client, and
the package's ground floor (src/envd/*.py but its front doors) imports nothing
above it: not the tools (envd.tools: the CLI, the bench), the daemon, the
client or the native core."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLIENT_SIDE = [*sorted((ROOT / "client").rglob("*.py")),
               *(ROOT / "src" / "envd" / name for name in ("protocol.py", "shm.py", "vector_base.py",
                                                   "buffer_layout.py", "vec_info.py", "vec_rows.py",
                                                   "vec_errors.py", "send_row_checks.py", "autoreset.py",
                                                   "int_args.py", "errors.py", "keys.py",
                                                   "hosted_pettingzoo.py", "make_options.py"))]
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


#: The package's front doors: envd.make / envd.connect (__init__.py), `python -m
#: envd` (__main__.py), the gymnasium adapters, the make they share
#: (vector_make.py) and PufferLib's backend (envd.puffer:
#: pufferlib.vector.make's backend= over puffer:<env>), which
#: reach into the layers above by design.  Every other module of src/envd/ is
#: the ground floor.
FRONT_DOORS = {"__init__.py", "__main__.py", "gymnasium_registry.py", "single_env.py",
               "vector_make.py", "puffer.py"}
GROUND_FLOOR = sorted(p for p in (ROOT / "src" / "envd").glob("*.py") if p.name not in FRONT_DOORS)
ABOVE_THE_GROUND_FLOOR = ("envd.tools", "envd.server", "envd.client", "envd.native",
                          "envd.integrations", "envd.gymnasium_registry", "envd.single_env",
                          "envd.vector_make")


def test_the_ground_floor_is_what_the_client_shares():
    names = {p.name for p in GROUND_FLOOR}
    assert {"errors.py", "protocol.py", "shm.py", "vector_base.py", "keys.py"} <= names, names
    assert not {"cli.py", "benchmark.py", "bench.py"} & names, "tools belong in envd/tools/"


@pytest.mark.parametrize("path", GROUND_FLOOR, ids=lambda p: str(p.relative_to(ROOT)))
def test_ground_floor_imports_nothing_above_it(path):
    bad = {m for m in imported_modules(path) if m.startswith(ABOVE_THE_GROUND_FLOOR)}
    assert not bad, f"{path.name} imports {sorted(bad)}"


@pytest.mark.parametrize("path", sorted((ROOT / "src" / "envd" / "tools").glob("*.py")),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_the_bench_and_the_cli_import_no_circle(path):
    """The bench (bench.py and its parts, bench_*.py) never imports the CLI;
    the CLI imports the bench only inside `envd bench`'s handler, never at
    module level."""
    if path.name == "bench.py" or path.name.startswith("bench_"):
        assert not {m for m in imported_modules(path) if m.startswith("envd.tools.cli")}
    else:
        top_level = {node.module for node in ast.parse(path.read_text()).body
                     if isinstance(node, ast.ImportFrom) and node.module}
        assert not {m for m in top_level if m.startswith("envd.tools")}, top_level


def test_nothing_below_the_tools_imports_them():
    below = [*GROUND_FLOOR, *(ROOT / "src" / "envd" / "integrations").glob("*.py"),
             *(ROOT / d / name for d in ("client", "server", "native")
               for name in sorted(p.name for p in (ROOT / d).glob("*.py")))]
    bad = {str(p.relative_to(ROOT)): sorted(m for m in imported_modules(p)
                                              if m.startswith("envd.tools"))
           for p in below}
    assert not {k: v for k, v in bad.items() if v}, bad
