"""The extras give users ranges, never exact pins (an `==` would make pip
replace a user's torch, perhaps with a multi-GB CUDA build); CI's pins live in
.ci/constraints.txt, which .ci/run passes with -c.  No extra installs both
pygame and pygame-ce (they own the same folder)."""
from __future__ import annotations

import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def names(requirements: list[str]) -> list[str]:
    return [re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower() for r in requirements]


def test_no_requirement_is_pinned_exactly():
    everything = PROJECT["dependencies"] + [r for extra in PROJECT["optional-dependencies"].values() for r in extra]
    pinned = [r for r in everything if "==" in r or "===" in r]
    assert not pinned, f"exact pins belong in .ci/constraints.txt: {pinned}"


def test_pygame_and_pygame_ce_are_never_both_installed():
    for extra, requirements in PROJECT["optional-dependencies"].items():
        assert not {"pygame", "pygame-ce"} <= set(names(requirements)), extra


def test_ci_installs_the_project_with_its_constraints():
    run = (ROOT / ".ci" / "run").read_text()
    assert "pip install '.[test]' -c .ci/constraints.txt" in run
    pins = [line for line in (ROOT / ".ci" / "constraints.txt").read_text().splitlines()
            if line and not line.startswith("#")]
    assert any(pin.startswith("torch==") for pin in pins), "CI must pin torch (its local CPU wheel)"
