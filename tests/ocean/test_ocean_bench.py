"""`envd bench --ocean`: one short run (--quick, breakout at N=4) against its
own daemon and PufferLib's own binding, then its report and files are
checked; the config reader and the targets on made-up inputs.  No timing
assertions: the numbers only have to exist."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import puffer_reference
import pytest

from envd.tools import bench_ocean

NUM_ENVS = 4
ROUNDS = 2


@pytest.fixture(scope="module")
def run(tmp_path_factory, ocean_builds, puffer_tree):
    """The quick run on breakout, from the tests' Ocean cache."""
    ocean_builds("breakout")  # built and recorded in the tests' cache
    out = tmp_path_factory.mktemp("bench-ocean") / "results"
    environ = {**os.environ, "ENVD_OCEAN_CACHE": str(puffer_reference.test_cache()),
               "ENVD_OCEAN_SOURCE": str(puffer_tree)}
    proc = subprocess.run(
        [sys.executable, "-m", "envd", "bench", "--ocean", "breakout", "--quick", "--out",
         str(out), "--sizes", str(NUM_ENVS), "--seconds", "0.02", "--rounds", str(ROUNDS),
         "--no-progress"],
        check=False, capture_output=True, text=True, timeout=900, cwd=out.parent, env=environ)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, out


def test_every_system_is_measured_or_says_why(run):
    proc, out = run
    assert "load average" in proc.stdout
    result = json.loads((out / "results.json").read_text())
    (entry,) = result["results"]
    assert (entry["env"], entry["num_envs"], entry["rows"]) == ("breakout", NUM_ENVS, NUM_ENVS)
    measured = set(entry["rates"])
    assert measured == set(bench_ocean.SYSTEMS) - set(entry["missing"])
    for system in (bench_ocean.PUFFER_SERIAL, bench_ocean.SERIAL, bench_ocean.TWO_THREADS,
                   bench_ocean.AUTO, bench_ocean.DAEMON):
        values = entry["rates"][system]
        assert len(values) == ROUNDS and all(v > 0 for v in values), (system, values)
        assert system in proc.stdout
    for system, why in entry["missing"].items():
        assert f"{system}: n/a: {why}" in proc.stdout
    assert len(entry["ratios"][bench_ocean.AUTO]) == ROUNDS


def test_the_files_and_targets(run):
    proc, out = run
    assert (out / "report.txt").read_text() in proc.stdout
    table = (out / "table.md").read_text().splitlines()
    assert table[0].startswith("| env | N |") and table[2].startswith(f"| breakout | {NUM_ENVS} |")
    targets = json.loads((out / "results.json").read_text())["targets"]
    assert [t["target"] for t in targets] == [
        f"breakout N={NUM_ENVS}: envd auto / PufferLib serial"]
    assert targets[0]["status"] in ("PASS", "FAIL", "NOT JUDGED")


def test_unbuilt_env_is_one_clear_line(tmp_path, ocean_builds):
    ocean_builds("breakout")
    environ = {**os.environ, "ENVD_OCEAN_CACHE": str(puffer_reference.test_cache())}
    proc = subprocess.run([sys.executable, "-m", "envd", "bench", "--ocean", "nosuchenv",
                           "--quick", "--out", str(tmp_path / "r"), "--no-progress"],
                          check=False, capture_output=True, text=True, timeout=300, env=environ)
    assert proc.returncode == 1
    assert "no Ocean build of nosuchenv" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_config_size_is_the_env_section(tmp_path):
    config = tmp_path / "pufferlib" / "config" / "ocean"
    config.mkdir(parents=True)
    (config / "go.ini").write_text("[vec]\nnum_envs = 8\n\n[env]\nnum_envs = 1024\n")
    (config / "odd.ini").write_text("[vec]\nnum_envs = 8\n")
    assert bench_ocean.config_num_envs(tmp_path, "go") == 1024
    assert bench_ocean.config_num_envs(tmp_path, "odd") is None
    assert bench_ocean.config_num_envs(tmp_path, "missing") is None


def test_targets_name_two_threads_only_for_go_and_enduro_at_config_size():
    def entry(env, n, ratio):
        return {"env": env, "num_envs": n,
                "ratios": {bench_ocean.AUTO: [ratio], bench_ocean.TWO_THREADS: [2 * ratio]}}

    lines = bench_ocean.targets([entry("go", 64, 1.0), entry("go", 1024, 0.5),
                                 entry("breakout", 1024, 1.0)])
    names = [t["target"] for t in lines]
    assert names == ["go N=64: envd auto / PufferLib serial",
                     "go N=1024: envd auto / PufferLib serial",
                     "breakout N=1024: envd auto / PufferLib serial",
                     "go N=1024: envd 2 threads / PufferLib serial"]
    assert [t["status"] for t in lines] == ["PASS", "FAIL", "PASS", "FAIL"]


@pytest.mark.parametrize("args, message", [
    (["--ocean", "breakout", "--python"], "--python and --ocean are separate runs"),
    (["--ocean", "breakout", "--num-envs", "4"], "--num-envs does not apply to --ocean"),
    (["--ocean", "breakout", "--sizes", "0"], "--sizes must be >= 1"),
])
def test_options_it_refuses(args, message):
    proc = subprocess.run([sys.executable, "-m", "envd", "bench", *args], check=False,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
