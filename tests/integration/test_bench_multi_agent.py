"""bench/bench_multi_agent.py (the README's multi-agent figures) runs every
configuration, the daemon's included, and prints one line each with its
rate and its per-round ratio to the mpe2 loop; its daemon is gone after."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mpe2.simple_spread_v3", reason="mpe2 is the benchmark's baseline")

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "bench_multi_agent.py"


def test_every_configuration_is_measured_and_compared_with_mpe2(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--envs", "8", "--rounds", "2",
                           "--seconds", "0.05", "--threads", "1"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "8 envs x 3 agents, 2 interleaved rounds" in lines[0] and "load average" in lines[0]
    names = [line.split("  ")[1] for line in lines[1:]]
    assert names[0] == "envd in-process serial" and names[-1] == "mpe2 Python loop"
    assert any(name.startswith("envd daemon 1 threads (shm, fast path)") for name in names)
    assert len(lines) == 5
    for line in lines[1:]:
        assert re.search(r"\d[\d.]*[kMG]? ±\d+%\s+\d+\.\d\dx ±\d+\.\d\d mpe2$", line), line
    assert lines[-1].rstrip().endswith("1.00x ±0.00 mpe2")
