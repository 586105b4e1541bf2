"""The distribution name: `envd` on the public package index is an unrelated
project, so envd is published as ``envd-rl`` (the import name and the command
stay ``envd``).  Every message and doc that tells a user to install an extra
must name the distribution, or pip would fetch that other project.
"""
from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
#: Folders and top-level files users read or run (not build outputs or virtualenvs).
SCANNED = ("README.md", "SECURITY.md", "mkdocs.yml", "docker-compose.yml", "docs", "src",
           "client", "server", "native", "tests", "deploy", "examples", "bench", ".ci")
SUFFIXES = {".py", ".md", ".yml", ".yaml", ".toml", ".txt", ".sh", ".c", ".h", ".cfg", ""}


def _distribution_name() -> str:
    match = re.search(r'^\[project\]\s*$(.*?)^name\s*=\s*"([^"]+)"', PYPROJECT, re.M | re.S)
    assert match, "pyproject.toml has no [project] name"
    return match.group(2)


def _extras() -> list[str]:
    section = re.search(r"^\[project\.optional-dependencies\]\s*$(.*?)^\[", PYPROJECT, re.M | re.S)
    assert section, "pyproject.toml has no [project.optional-dependencies]"
    return re.findall(r"^([a-z0-9][a-z0-9-]*)\s*=", section.group(1), re.M)


def _scanned_files() -> list[Path]:
    files: list[Path] = []
    for name in SCANNED:
        path = ROOT / name
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files += [p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES
                      and "__pycache__" not in p.parts]
    return files


def test_distribution_name_is_not_the_taken_one():
    assert _distribution_name() == "envd-rl"
    assert re.search(r'^envd = "envd\.tools\.cli:main"$', PYPROJECT, re.M), "the command must stay envd"


def test_no_message_or_doc_names_an_extra_of_the_wrong_distribution():
    extras = _extras()
    assert {"metrics", "sb3", "bench", "test"} <= set(extras), extras
    # "envd[" + extra + "]" not preceded by a name character: envd-rl[metrics]
    # and the log format's envd[%(process)d] do not match.
    wrong = re.compile(r"(?<![\w.-])envd\[(?:" + "|".join(map(re.escape, extras)) + r")\]")
    found = []
    for path in _scanned_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            if wrong.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "extras named under the wrong distribution:\n" + "\n".join(found)


def test_extras_are_named_with_the_distribution_somewhere():
    # The check above passes vacuously if nothing names an extra; the install
    # messages of the optional features must exist and use the new name.
    name = _distribution_name()
    texts = "\n".join(p.read_text(encoding="utf-8", errors="replace") for p in _scanned_files())
    for extra in ("metrics", "sb3", "bench"):
        assert f"pip install '{name}[{extra}]'" in texts, f"no install hint for {name}[{extra}]"


def test_installed_distribution_provides_the_envd_command_and_package():
    dist = importlib.metadata.distribution(_distribution_name())
    scripts = {ep.name: ep.value for ep in dist.entry_points if ep.group == "console_scripts"}
    assert scripts == {"envd": "envd.tools.cli:main"}
    assert any(Path(str(f)).as_posix() == "envd/__init__.py" for f in dist.files or [])
