"""The soak script (bench/soak.py) in its short CI version: 30 seconds of
three client processes stepping every built-in env through a daemon of its
own, in sync and async mode, with faults injected (SIGKILLed and SIGSTOPped
clients, hostile raw messages, clients and envs closed with sends in flight);
every result checked against an in-process replay, and the daemon's leak
counters flat.  Longer runs: ``python bench/soak.py --minutes M``."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SOAK = Path(__file__).resolve().parents[2] / "bench" / "soak.py"
SECONDS = 30
#: Fault kinds every CI run must inject at least once.
REQUIRED_FAULTS = ("client_sigkilled", "client_frozen", "hostile_message",
                   "client_closed_in_flight", "env_closed_mid_async")


def test_soak_30_seconds(tmp_path):
    # From a temporary folder: the checkout's envd/ folder never shadows the package.
    proc = subprocess.run(
        [sys.executable, str(SOAK), "--seconds", str(SECONDS), "--clients", "3", "--lease", "3",
         "--seed", "20240611"],
        cwd=tmp_path, capture_output=True, text=True, check=False, timeout=SECONDS + 540)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    summary = output[output.index("==== envd soak summary ===="):]
    steps = int(re.search(r"^steps verified: (\d+)", summary, re.MULTILINE).group(1))
    episodes = int(re.search(r"episode ends (\d+)\)", summary).group(1))
    mismatches = int(re.search(r"^mismatches: (\d+)", summary, re.MULTILINE).group(1))
    errors = int(re.search(r"^errors: (\d+)", summary, re.MULTILINE).group(1))
    listed = re.search(r"^faults injected: \d+ \((.*)\)$", summary, re.MULTILINE).group(1)
    faults = {kind: int(count) for kind, count in re.findall(r"(\w+)=(\d+)", listed)}
    assert steps >= 1000, summary
    assert episodes >= 100, summary
    assert mismatches == 0 and errors == 0, summary
    for kind in REQUIRED_FAULTS:
        assert faults.get(kind, 0) >= 1, (kind, summary)
    assert re.search(r"^leaks: none$", summary, re.MULTILINE), summary
    for key in ("fds", "threads", "segments", "shm_mappings"):
        before, after = re.search(rf"^  {key} +(\d+) +(\d+)$", summary, re.MULTILINE).groups()
        assert before == after, (key, summary)
    assert summary.rstrip().endswith("result: PASS"), summary
