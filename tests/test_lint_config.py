"""The lint and type-check configuration (pyproject.toml [tool.ruff],
[tool.mypy]) and CI's use of it.  The real check is .ci/run running ruff and
mypy (any finding fails CI); these tests keep the configuration from losing
what it promises: the rule set, the strict public API, reasons on ignores,
the pins."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib

import envd

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
CI_RUN = (ROOT / ".ci" / "run").read_text()
#: the Python of the repository: the package's four folders and the rest
SOURCE_FOLDERS = ("src", "native", "client", "server", "tests", "bench", "examples")


def _python_files() -> list[Path]:
    files = [ROOT / "setup.py"]
    for folder in SOURCE_FOLDERS:
        files += sorted((ROOT / folder).rglob("*.py"))
    return files


def _strict_modules() -> set[str]:
    strict: set[str] = set()
    for override in PYPROJECT["tool"]["mypy"].get("overrides", []):
        if override.get("disallow_untyped_defs") and override.get("disallow_any_generics"):
            modules = override["module"]
            strict.update([modules] if isinstance(modules, str) else modules)
    return strict


def test_ruff_names_a_rule_set_and_targets_requires_python():
    ruff = PYPROJECT["tool"]["ruff"]
    selected = set(ruff["lint"]["select"])
    assert {"E", "W", "F", "I", "B", "UP"} <= selected
    requires = PYPROJECT["project"]["requires-python"]
    assert requires == ">=3.10" and ruff["target-version"] == "py310"
    assert ruff["line-length"] >= 100


def test_mypy_checks_the_installed_package_with_its_dependencies_typed():
    mypy = PYPROJECT["tool"]["mypy"]
    assert mypy["packages"] == ["envd"]
    assert "ignore-without-code" in mypy["enable_error_code"]
    assert mypy["warn_unused_ignores"] is True
    # no blanket switch: modules without types are named one by one
    assert "ignore_missing_imports" not in mypy
    assert "ignore_errors" not in mypy


def test_every_public_name_is_defined_in_a_strictly_checked_module():
    strict = _strict_modules()
    assert "envd" in strict
    defined_in = set()
    for name in envd.__all__:
        value = getattr(envd, name)
        module = getattr(value, "__module__", None)
        if module is not None and module.startswith("envd"):
            defined_in.add(module)
    assert {"envd.errors", "envd.client", "envd.client.connection",
            "envd.native.vector_env"} <= defined_in
    assert defined_in <= strict, f"public API modules not checked strictly: {defined_in - strict}"


def test_the_strict_modules_are_never_relaxed():
    strict = _strict_modules()
    for override in PYPROJECT["tool"]["mypy"].get("overrides", []):
        modules = override["module"]
        modules = {modules} if isinstance(modules, str) else set(modules)
        if override.get("disable_error_code") or override.get("ignore_errors"):
            assert not modules & strict, f"a strict module is relaxed: {modules & strict}"


@pytest.mark.parametrize("path", _python_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_ignore_names_its_code_and_a_reason(path):
    """`# type: ignore[code]  # why` and `# noqa: CODE -- why` or a comment
    of its own: never a bare ignore."""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        where = f"{path.relative_to(ROOT)}:{number}"
        found = re.search(r"#\s*type:\s*ignore(\[[^\]]*\])?(.*)$", line)
        if found:
            assert found.group(1), f"{where}: a type: ignore without its error code"
            assert re.match(r"\s*#\s*\S", found.group(2)), f"{where}: a type: ignore without a reason"
        assert not re.search(r"#\s*noqa\s*($|[^:\s])", line), f"{where}: a noqa without its rule code"


def test_ci_runs_both_with_pinned_versions():
    assert re.search(r'ruff" check \.$', CI_RUN, re.M)
    assert re.search(r"python\" -m mypy( |$)", CI_RUN, re.M)
    assert "-c .ci/lint-constraints.txt" in CI_RUN
    pins = {}
    for line in (ROOT / ".ci" / "lint-constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"not an exact pin: {line}"
            pins[name.lower().replace("_", "-")] = version
    lint = PYPROJECT["project"]["optional-dependencies"]["lint"]
    for requirement in lint + PYPROJECT["project"]["dependencies"]:
        name = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower().replace("_", "-")
        assert name in pins, f"{name} (pyproject) is not pinned in .ci/lint-constraints.txt"
