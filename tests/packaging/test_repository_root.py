"""Nothing in the checkout shadows the installed package (issue 16).

A new user runs `pip install .` and then works in the repository root: a
trainer script saved there, `python -m envd ...`, README's plugin build line
`$(python -m envd.native --include)` and `python -m pytest` all put the root on
sys.path first.  When the package's ground floor lay in the root as envd/,
Python found that folder before the installed package, and everything failed
with ``No module named 'envd.client'``.  The ground floor now lies under src/,
so no folder of the root is named envd.

An editable install (`pip install -e .`) must work too, native core included:
tested in a fresh virtualenv on a copy of the sources, skipped (saying why)
only when pip cannot reach its package index for the dependencies.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: What a build needs (as deploy/Dockerfile copies it).
SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "src", "client", "server",
           "native")
#: A trainer script: the client side, and a few in-process steps (the native core).
TRAINER = """
import envd
import envd.client
import envd.native._envd_native
import numpy as np
with envd.make("CartPole-v1", num_envs=2, seed=0, num_threads=0) as env:
    env.reset(seed=0)
    obs, rew, term, trunc, info = env.step(np.zeros(2, dtype=np.int64))
    assert obs.shape == (2, 4), obs.shape
print(envd.__file__)
print(envd.client.__file__)
"""
#: Generous: a loaded 2-core machine compiles the native core slowly.
INSTALL_TIMEOUT = 900
RUN_TIMEOUT = 300
#: pip's words when it cannot reach an index (the only reason to skip).
UNREACHABLE = ("Could not find a version that satisfies", "No matching distribution found",
               "Failed to establish a new connection", "Temporary failure in name resolution",
               "Network is unreachable", "ProxyError")


def _run(argv: list[str], cwd: Path, timeout: float = RUN_TIMEOUT,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in (env or os.environ).items() if k != "PYTHONPATH"}
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=clean)


def _checked(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, f"{done.args}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return done.stdout


def _installed_envd_dir(python: str) -> Path:
    """Where `python` imports envd from when nothing shadows it (cwd /)."""
    out = _checked(_run([python, "-c", "import envd; print(envd.__file__)"], cwd=Path("/")))
    return Path(out.strip()).parent


# ---- after `pip install .`, in the repository root ------------------------------------------

def test_no_folder_of_the_root_is_named_like_the_package():
    assert not (ROOT / "envd").exists(), "a root envd/ folder shadows the installed package"


def test_a_trainer_script_in_the_repository_root_imports_the_installed_package():
    # `python -c` from the root puts the root first on sys.path, as a script saved there does
    out = _checked(_run([sys.executable, "-c", TRAINER], cwd=ROOT)).split()
    assert Path(out[0]).parent == _installed_envd_dir(sys.executable), out
    assert "envd" in Path(out[1]).parts


def test_python_m_envd_in_the_repository_root():
    out = _checked(_run([sys.executable, "-m", "envd", "list"], cwd=ROOT))
    assert "CartPole-v1" in out


def test_readme_plugin_include_line_in_the_repository_root():
    out = _checked(_run([sys.executable, "-m", "envd.native", "--include"], cwd=ROOT)).strip()
    assert (Path(out) / "envd.h").is_file(), out


def test_python_m_pytest_in_the_repository_root_imports_the_installed_package():
    # test_wheel.py imports envd at module level; collecting it is enough
    done = _run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                 "tests/packaging/test_wheel.py"], cwd=ROOT)
    assert done.returncode == 0 and "error" not in done.stdout.lower(), done.stdout + done.stderr


# ---- `pip install -e .` ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def editable(tmp_path_factory) -> tuple[str, Path]:
    """A fresh virtualenv with an editable install of a copy of the sources:
    (its python, the copy's root)."""
    base = tmp_path_factory.mktemp("editable")
    checkout = base / "checkout"
    for name in SOURCES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, checkout / name, ignore=shutil.ignore_patterns(
                "__pycache__", "*.so", "*.o", "build", "*.egg-info", "_envd_native.c"))
        else:
            checkout.mkdir(exist_ok=True)
            shutil.copy2(source, checkout / name)
    venv.EnvBuilder(with_pip=True).create(base / "venv")
    python = str(base / "venv" / "bin" / "python")
    done = _run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                 "-e", str(checkout)], cwd=base, timeout=INSTALL_TIMEOUT)
    if done.returncode != 0 and any(s in done.stdout + done.stderr for s in UNREACHABLE):
        pytest.skip(f"pip cannot reach its package index: {done.stderr.strip()[-300:]}")
    _checked(done)
    return python, checkout


def test_editable_install_serves_the_checkout_with_its_native_core(editable):
    python, checkout = editable
    out = _checked(_run([python, "-c", TRAINER], cwd=checkout)).split()
    assert Path(out[0]) == checkout / "src" / "envd" / "__init__.py", out
    assert Path(out[1]) == checkout / "client" / "__init__.py", out
    # and from elsewhere: the editable finder, not the cwd, serves it
    out = _checked(_run([python, "-c", TRAINER], cwd=Path("/"))).split()
    assert Path(out[0]) == checkout / "src" / "envd" / "__init__.py", out


def test_editable_install_runs_the_tools_in_the_checkout_root(editable):
    python, checkout = editable
    assert "CartPole-v1" in _checked(_run([python, "-m", "envd", "list"], cwd=checkout))
    include = _checked(_run([python, "-m", "envd.native", "--include"], cwd=checkout)).strip()
    assert Path(include) == checkout / "native" / "include", include
    script = Path(python).with_name("envd")
    assert "CartPole-v1" in _checked(_run([str(script), "list"], cwd=checkout))
