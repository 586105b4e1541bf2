"""`envd bench --ocean`: one short run (--quick, pong and go at N=4: the
pair's two envs) against its own daemons, PufferLib's own binding and
PufferLib's Multiprocessing backend, then its report and files are checked;
the config reader and the targets on made-up inputs.  No timing assertions:
the numbers only have to exist."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import puffer_reference
import pytest

from envd.tools import bench_ocean

NUM_ENVS = 4
ROUNDS = 2
ENVS = ("pong", "go")  # bench_ocean.PAIR: the pair is measured too


def puffer_vector_importable() -> bool:
    """Whether pufferlib-core's vector module imports (in a fresh process:
    other Ocean tests put a stand-in ``pufferlib`` in this one's modules)."""
    proc = subprocess.run([sys.executable, "-c", "import pufferlib.vector"], check=False,
                          capture_output=True, timeout=300)
    return proc.returncode == 0


@pytest.fixture(scope="module")
def run(tmp_path_factory, ocean_builds, puffer_tree):
    """The quick run on pong and go, from the tests' Ocean cache."""
    for env in ENVS:
        ocean_builds(env)  # built and recorded in the tests' cache
    out = tmp_path_factory.mktemp("bench-ocean") / "results"
    environ = {**os.environ, "ENVD_OCEAN_CACHE": str(puffer_reference.test_cache()),
               "ENVD_OCEAN_SOURCE": str(puffer_tree)}
    proc = subprocess.run(
        [sys.executable, "-m", "envd", "bench", "--ocean", ",".join(ENVS), "--quick", "--out",
         str(out), "--sizes", str(NUM_ENVS), "--seconds", "0.02", "--rounds", str(ROUNDS),
         "--no-progress"],
        check=False, capture_output=True, text=True, timeout=900, cwd=out.parent, env=environ)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, out


def test_every_system_is_measured_or_says_why(run):
    proc, out = run
    assert "load average" in proc.stdout
    result = json.loads((out / "results.json").read_text())
    assert [(e["env"], e["num_envs"], e["rows"]) for e in result["results"]] == [
        (env, NUM_ENVS, NUM_ENVS) for env in ENVS]
    # pufferlib-core (the test extra) present: PufferLib's Multiprocessing runs
    always = [bench_ocean.PUFFER_SERIAL, bench_ocean.SERIAL, bench_ocean.TWO_THREADS,
              bench_ocean.AUTO, bench_ocean.IN_PLACE, bench_ocean.DAEMON,
              bench_ocean.DAEMON_ONE]
    if puffer_vector_importable():
        always.append(bench_ocean.PUFFER_MP)
    for entry in result["results"]:
        measured = set(entry["rates"])
        assert measured == set(bench_ocean.SYSTEMS) - set(entry["missing"])
        for system in always:
            values = entry["rates"].get(system)
            assert values and len(values) == ROUNDS and all(v > 0 for v in values), (
                system, entry["missing"].get(system))
        for system, why in entry["missing"].items():
            assert f"{system}: n/a: {why}" in proc.stdout
        # every ratio of two measured systems, in every round (without
        # pufferlib-core, none with PufferLib's Multiprocessing)
        pairs = {**{name: (name, bench_ocean.PUFFER_SERIAL)
                    for name in (bench_ocean.AUTO, bench_ocean.IN_PLACE)},
                 **bench_ocean.OTHER_RATIOS, **bench_ocean.CPU_RATIOS}
        for name, systems in pairs.items():
            if measured.issuperset(systems):
                assert len(entry["ratios"].get(name, ())) == ROUNDS, name
            else:
                assert name not in entry["ratios"], name
        # CPU time per agent step: in-process systems only (not the daemon's)
        assert set(entry["cpu_ns"]) == set(bench_ocean.IN_PROCESS)
        assert all(len(v) == ROUNDS and min(v) > 0 for v in entry["cpu_ns"].values())
        # what auto ran: its threads, and every step counted inline or pooled
        auto = entry["auto"]
        assert auto["num_threads"] == max(0, len(os.sched_getaffinity(0)) - 1)
        assert auto["inline_steps"] + auto["pooled_steps"] >= ROUNDS
        assert f"{auto['num_threads']} thread(s), {auto['inline_steps']} inline" in proc.stdout
        # and the step times it chose between (0 for a way never sampled)
        assert auto["inline_step_ns"] >= 0 and auto["pooled_step_ns"] >= 0
        assert (f"pooled; {auto['inline_step_ns']:.1f} / {auto['pooled_step_ns']:.1f} ns"
                in proc.stdout)
        # and what the 2-thread column ran (a column that stepped inline is serial)
        two = entry["two_threads"]
        assert two["num_threads"] == 2
        assert two["inline_steps"] + two["pooled_steps"] >= ROUNDS
        assert (f"2 thread(s), {two['inline_steps']} inline / {two['pooled_steps']} pooled; "
                f"{two['inline_step_ns']:.1f} / {two['pooled_step_ns']:.1f} ns" in proc.stdout)
    for system in set(bench_ocean.SYSTEMS) - {bench_ocean.PUFFER_MP}:
        assert system in proc.stdout
    assert "PufferLib MP, 2 workers" in proc.stdout  # (the column's short name)


def test_the_pair_is_measured_in_one_daemon(run):
    proc, out = run
    pair = json.loads((out / "results.json").read_text())["pair"]
    cheap, deep = bench_ocean.PAIR
    assert pair["cheap"] == {"env_id": f"puffer:{cheap}", "num_envs": NUM_ENVS}
    assert pair["heavy"] == {"env_id": f"puffer:{deep}", "num_envs": NUM_ENVS}
    assert pair["cap"] == bench_ocean.PAIR_CAP
    for config in ("capped", "uncapped"):
        assert len(pair["totals"][config]) == ROUNDS and all(v > 0 for v in
                                                              pair["totals"][config])
    assert f"capped (max_threads={bench_ocean.PAIR_CAP})" in proc.stdout


def test_the_files_and_targets(run):
    proc, out = run
    assert (out / "report.txt").read_text() in proc.stdout
    table = (out / "table.md").read_text().splitlines()
    assert table[0].startswith("| env | N |") and "| auto / PufferLib MP |" in table[0]
    assert table[2].startswith(f"| pong | {NUM_ENVS} |")
    assert all(row.count("|") == table[0].count("|") for row in table)
    targets = json.loads((out / "results.json").read_text())["targets"]
    names = [t["target"] for t in targets]
    assert names[:-1] == [f"{env} N={NUM_ENVS}: {what}" for what in (
        "envd auto / PufferLib serial", "envd in-place / PufferLib serial",
        "envd auto / PufferLib Multiprocessing",
        "envd daemon, 1 thread / envd serial (like for like)", "envd auto / envd serial")
        for env in ENVS]
    assert names[-1].startswith(f"puffer:pong x{NUM_ENVS} capped at max_threads=")
    assert "pair total >= 1.0x uncapped" in names[-1]
    importable = puffer_vector_importable()
    for t in targets:  # N/A only where PufferLib's Multiprocessing cannot run
        judged = importable or "Multiprocessing" not in t["target"]
        assert t["status"] in ("PASS", "FAIL", "NOT JUDGED") or (
            t["status"] == "N/A" and not judged), t
    for t in targets:
        assert t["target"] in proc.stdout


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
                "ratios": {bench_ocean.AUTO: [ratio], bench_ocean.IN_PLACE: [1.2 * ratio],
                           bench_ocean.TWO_THREADS: [2 * ratio]}}

    lines = bench_ocean.targets([entry("go", 64, 1.0), entry("go", 1024, 0.5),
                                 entry("breakout", 1024, 1.0)])
    lines = [t for t in lines if "PufferLib serial" in t["target"]]  # the others: n/a
    names = [t["target"] for t in lines]
    assert names == ["go N=64: envd auto / PufferLib serial",
                     "go N=1024: envd auto / PufferLib serial",
                     "breakout N=1024: envd auto / PufferLib serial",
                     "go N=64: envd in-place / PufferLib serial",
                     "go N=1024: envd in-place / PufferLib serial",
                     "breakout N=1024: envd in-place / PufferLib serial",
                     "go N=1024: envd 2 threads / PufferLib serial"]
    assert [t["status"] for t in lines] == ["PASS", "FAIL", "PASS", "PASS", "FAIL", "PASS",
                                            "FAIL"]


def test_multiprocessing_and_like_for_like_targets_read_their_ratios():
    ratios = {"auto / PufferLib MP": [1.5, 1.4], "daemon 1 thread / serial": [0.8, 0.85],
              "auto / serial": [0.9, 1.1]}
    lines = bench_ocean.targets([{"env": "go", "num_envs": 64, "ratios": ratios}])
    status = {t["target"]: (t["status"], t["limit"]) for t in lines}
    assert status == {
        "go N=64: envd auto / PufferLib serial": ("N/A", 0.95),  # not measured
        "go N=64: envd in-place / PufferLib serial": ("N/A", 0.95),
        "go N=64: envd auto / PufferLib Multiprocessing": ("PASS", 1.0),
        "go N=64: envd daemon, 1 thread / envd serial (like for like)": ("FAIL", 0.9),
        "go N=64: envd auto / envd serial": ("NOT JUDGED", 0.95)}


@pytest.mark.parametrize("args, message", [
    (["--ocean", "breakout", "--python"], "--python and --ocean are separate runs"),
    (["--ocean", "breakout", "--num-envs", "4"], "--num-envs does not apply to --ocean"),
    (["--ocean", "breakout", "--sizes", "0"], "--sizes must be >= 1"),
])
def test_options_it_refuses(args, message):
    proc = subprocess.run([sys.executable, "-m", "envd", "bench", *args], check=False,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_multiprocessing_that_cannot_run_says_why(tmp_path, puffer_tree):
    """The Multiprocessing column's n/a is the error the child met (here an N
    that 2 workers cannot split; without pufferlib-core, the import error)."""
    from envd.native import ocean_reference, ocean_source
    from envd.tools.bench_ocean_mp import PufferMultiprocessingRun

    built = ocean_reference.build("pong", puffer_tree, puffer_reference.test_cache())
    batches = [np.zeros(3, np.int32)]
    with pytest.raises(RuntimeError) as caught:
        PufferMultiprocessingRun(ocean_source.ocean_dir(puffer_tree), "pong", built, 3, batches,
                                 tmp_path)
    if puffer_vector_importable():
        assert "ValueError: N=3 is not a multiple of 2 workers" in str(caught.value)
    else:  # the import's own error
        assert "Error" in str(caught.value) and "pufferlib" in str(caught.value)


def test_the_pair_says_why_it_was_not_measured():
    bench = bench_ocean.OceanBench(bench_ocean.Settings(progress=False))
    cheap, deep = bench_ocean.PAIR
    assert bench.measure_pair(object(), [("breakout", 64), (deep, 64)]) == {
        "missing": f"needs {cheap} and {deep} in the run"}
    assert bench.measure_pair(None, [(cheap, 64), (deep, 64)]) == {
        "missing": "the daemon did not start"}
