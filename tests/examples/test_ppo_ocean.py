"""examples/ppo_ocean.py through a daemon serving PufferLib's Ocean CartPole
(built from PufferLib's source in the Ocean tests' cache): PPO learns, from a
random policy's ~18 to the target of 150 (reached within ~12,000 steps for
seeds 1-5 on the development box; the budget here is ten times that)."""
from __future__ import annotations

import sys
from pathlib import Path

from support.daemon import DaemonProcess, segments_of
from test_examples import result_fields, run_example

from envd.native import ocean_build

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ocean"))
import puffer_reference


def test_ppo_learns_ocean_cartpole_through_the_daemon(tmp_path):
    cache = puffer_reference.test_cache()
    ocean_build.build_env("cartpole", puffer_reference.source_tree(), cache)
    with DaemonProcess(tmp_path / "daemon", "--threads", "1", "--ocean", "cartpole",
                       "--ocean-cache", str(cache)) as proc:
        out = run_example("ppo_ocean.py", "--endpoint", proc.endpoint, "--seed", "1",
                          "--total-steps", "120000", "--log-every", "4", cwd=tmp_path)
    assert proc.proc.returncode == 0, proc.log()
    assert segments_of(proc.pid) == []
    assert out.returncode == 0, out.stdout + out.stderr
    result = result_fields(out.stdout)
    assert result["env"] == "puffer:cartpole" and result["losses_finite"] == "True"
    assert result["solved"] == "True"
    # a random policy's episodes last ~20 steps; the trained ones, 150 and more
    assert float(result["first_mean"]) < 40 < 150 <= float(result["mean_return"]), out.stdout
    assert "mean return (last 20)" in out.stdout  # progress lines
