"""`envd bench --python`: one short run against its own real daemon
(--quick, N=4), then the report, the files and the README table are checked;
the pieces (interleaving, a missing peer, the targets, the ceiling's
processes) on made-up inputs.  No timing assertions: the numbers only have
to exist.  PufferLib and SB3 are optional (the ``bench`` extra): without
them their rows must say n/a and why."""
from __future__ import annotations

import glob
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from envd.tools import bench_python, cli
from envd.tools.bench import Unavailable

NUM_ENVS = 4
ROUNDS = 2
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
#: the temporary folders a run makes (its daemon's endpoint lies there), in
#: the run's own TMPDIR (private_tmp): other runs on the machine are not seen
BENCH_FOLDERS = "envd-bench-python-*"
HAS = {bench_python.PUFFER: importlib.util.find_spec("pufferlib") is not None,
       bench_python.SB3: importlib.util.find_spec("stable_baselines3") is not None,
       bench_python.ENVPOOL: importlib.util.find_spec("envpool") is not None}


def measured(system: str, env_id: str) -> bool:
    """Whether the run measures system on env_id: its peer is installed, and
    a MuJoCo env's systems leave out NOT_ON_MUJOCO."""
    return HAS.get(system, True) and not (env_id in bench_python.MUJOCO_ENVS
                                          and system in bench_python.NOT_ON_MUJOCO)
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def private_tmp(folder) -> dict[str, str]:
    """The environment of a run whose temporary folders go under folder."""
    folder.mkdir(exist_ok=True)
    return {**os.environ, "TMPDIR": str(folder)}


def processes_naming(text: str) -> list[int]:
    """The processes whose command line holds text (a run's daemon names its
    endpoint, in the run's temporary folder, there)."""
    found = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if text.encode() in f.read():
                    found.append(int(name))
        except (OSError, ValueError):
            continue
    return found


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """`envd bench --python --quick --num-envs 4`, stderr a pipe; its
    temporary folders under the module's own TMPDIR (run[2])."""
    out = tmp_path_factory.mktemp("bench-python") / "results"
    tmp = out.parent / "tmp"
    proc = subprocess.run(
        [sys.executable, "-m", "envd", "bench", "--python", "--quick", "--out", str(out),
         "--num-envs", str(NUM_ENVS), "--seconds", "0.05", "--rounds", str(ROUNDS)],
        check=False, capture_output=True, text=True, timeout=900, cwd=out.parent,
        env=private_tmp(tmp))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, out, tmp


def test_the_report_has_every_system_and_env(run):
    proc, _, _ = run
    stdout = proc.stdout
    assert "CPU:" in stdout and "load average" in stdout
    assert "WARNING: the machine was loaded" in stdout or "machine load: quiet" in stdout
    section = stdout.split(f"env steps per second, N={NUM_ENVS}", 1)[1].split("\n\n", 1)[0]
    header, *rows = section.splitlines()[1:]
    assert header.split()[1:] == list(bench_python.ENVS)
    table = {line[:34].strip(): line[34:].split() for line in rows if not line.startswith("  ")}
    assert list(table) == list(bench_python.SYSTEMS)
    for system, cells in table.items():
        for env_id in bench_python.ENVS:
            # '27.1k ±29%' per env: a median and its spread; or n/a and why
            if measured(system, env_id):
                value, plus = cells.pop(0), cells.pop(0)
                assert value[0].isdigit() and plus.startswith("±") and plus.endswith("%"), \
                    (system, env_id, value, plus)
            else:
                assert cells.pop(0) == "n/a", (system, env_id)
                why = section.split(f"  n/a {system} on {env_id}: ")[1].split("\n")[0]
                assert "not installed" in why or "not measured on MuJoCo" in why, why
        assert not cells, (system, cells)
    # the default rule's pick is named, per env
    for env_id in bench_python.ENVS:
        assert f"  {bench_python.ROW_DEFAULT} on {env_id}: " in section
    assert "round trip of one step, N=1, hosted py:CartPole-v1" in stdout
    for name in bench_python.LATENCY_SYSTEMS:
        assert f"  {name}" in stdout.split("round trip of one step", 1)[1]
    targets = stdout.split("\ntargets (", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    assert len(targets) == len(bench_python.TARGETS)
    for line in targets:
        assert line.split()[0] in ("PASS", "FAIL", "NOT", "N/A"), line
    puffer = next(line for line in targets if bench_python.PUFFER in line)
    assert ("N/A" in puffer) == (not HAS[bench_python.PUFFER]), puffer
    # CPU time per env step: the rows whose every process is counted (not a
    # daemon's, nor AsyncVectorEnv's), workers apart; SyncVectorEnv 1.00x
    cpu = stdout.split("\nCPU time per env step", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    rows = {line[:34].strip(): line[34:].split() for line in cpu}
    assert bench_python.ROW_DAEMON not in rows and bench_python.GYM_ASYNC not in rows
    assert rows[bench_python.GYM_SYNC][1::2] == ["1.00x"] * len(bench_python.ENVS)
    caller, workers = (float(x) for x in rows[bench_python.ROW_WORKERS][0].split("+"))
    assert caller > 0 and workers > 0
    assert "+" not in rows[bench_python.ROW_SERIAL][0]  # (no workers: the caller steps)


def test_the_json_csv_and_readme_table(run):
    _, out, _ = run
    r = json.loads((out / "results.json").read_text())
    assert r["num_envs"] == NUM_ENVS and r["envs"] == list(bench_python.ENVS)
    for env_id in bench_python.ENVS:
        entry = r["table"][env_id]
        for system in bench_python.SYSTEMS:
            values = entry["rounds"].get(system)
            if not measured(system, env_id):
                assert values is None and entry["cells"][system].startswith("n/a: ")
                continue
            assert len(values) == ROUNDS and min(values) > 0, (env_id, system)
            assert entry["cells"][system] == pytest.approx(sum(values) / 2)  # 2 rounds' median
        workers = entry["labels"][bench_python.ROW_DEFAULT]
        assert workers.endswith(" workers") and int(workers.split()[0]) in (0, 1, 2, NUM_ENVS)
    latency = r["latency_us"]
    assert latency["daemon_path"] in ("fast path", "socket path")
    for name in bench_python.LATENCY_SYSTEMS:
        assert latency[name]["p99"] >= latency[name]["p50"] > 0
        assert len(latency[name]["p50_rounds"]) == ROUNDS
    assert {t["status"] for t in r["targets"]} <= {"PASS", "FAIL", "NOT JUDGED", "N/A"}
    assert r["machine"]["load"]["seconds"] > 0
    csv_lines = (out / "results.csv").read_text().splitlines()
    assert csv_lines[0] == "section,env_id,system,num_envs,value,min,max,rounds,note"
    assert len(csv_lines) == 1 + len(bench_python.ENVS) * len(bench_python.SYSTEMS) \
        + 2 * len(bench_python.LATENCY_SYSTEMS)
    table = (out / "readme_table.md").read_text()
    lines = table.splitlines()
    assert lines[0].startswith(f"| system (N={NUM_ENVS}) | Acrobot-v1 steps/s | x Sync |")
    rates, cpu = table.split(f"\n{bench_python.CPU_TITLE}", 1)
    assert sum(line.startswith("| ") for line in rates.splitlines()) \
        == 1 + len(bench_python.SYSTEMS)
    # then the CPU time of the rows whose every process is counted: envd's 4
    # in-process rows, SyncVectorEnv and EnvPool where installed
    assert sum(line.startswith("| ") for line in cpu.splitlines()) \
        == 1 + 5 + HAS[bench_python.ENVPOOL]
    assert "One step of one hosted py:CartPole-v1 (N=1): " in table
    assert (out / "report.txt").read_text().strip()


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib not installed")
def test_the_plot_is_a_png(run):
    _, out, _ = run
    assert (out / "python_envs.png").read_bytes()[:8] == PNG_MAGIC


def test_no_daemon_is_left(run):
    """The run's daemon (its endpoint lies in a folder named
    envd-bench-python-* in the run's TMPDIR) has exited, and the folder is
    gone."""
    _, _, tmp = run
    assert not processes_naming(f"{tmp}/envd-bench-python-")
    assert not glob.glob(str(tmp / BENCH_FOLDERS))


# ---- pieces, on made-up inputs -------------------------------------------------------------
class RecordingRun:
    def __init__(self, name: str, calls: list, label: str | None = None):
        self.name, self.calls, self.closed, self.label = name, calls, False, label

    def rate(self, seconds: float) -> float:
        self.calls.append(self.name)
        return float(len(self.calls))

    def close(self) -> None:
        self.closed = True


def test_the_systems_are_measured_round_by_round():
    calls: list[str] = []
    runs = {}

    def unavailable():
        raise Unavailable("pufferlib not installed (pip install 'envd-rl[bench]')")

    def broken():
        raise OSError("no more processes")

    def factory(name, label=None):
        def make():
            runs[name] = RecordingRun(name, calls, label)
            return runs[name]
        return make

    def make(env_id, n, client):
        return {"A": factory("A", "2 workers"), "B": factory("B"), "C": factory("C"),
                bench_python.PUFFER: unavailable, bench_python.SB3: broken}

    bench = bench_python.PythonBench(bench_python.Settings(rounds=3, seconds=0.01,
                                                           progress=False))
    entry = bench.measure_env("CartPole-v1", None, make=make)
    assert [sorted(calls[i:i + 3]) for i in range(0, 9, 3)] == [["A", "B", "C"]] * 3
    assert all(len(entry["rounds"][k]) == 3 for k in "ABC")
    assert entry["missing"] == {bench_python.PUFFER: "pufferlib not installed (pip install "
                                                     "'envd-rl[bench]')",
                                bench_python.SB3: "OSError: no more processes"}
    assert entry["labels"] == {"A": "2 workers"}
    assert all(run.closed for run in runs.values())


def test_envd_failing_is_not_a_result():
    """A peer that fails is an n/a row; envd failing stops the run (its runs closed)."""
    made = []

    def make(env_id, n, client):
        def ok():
            made.append(RecordingRun("x", []))
            return made[-1]

        def envd_fails():
            raise RuntimeError("envd broke")
        return {"gymnasium SyncVectorEnv": ok, bench_python.ROW_WORKERS: envd_fails}

    bench = bench_python.PythonBench(bench_python.Settings(rounds=1, progress=False))
    with pytest.raises(RuntimeError, match="envd broke"):
        bench.measure_env("CartPole-v1", None, make=make)
    assert made and all(run.closed for run in made)


def test_missing_peers_say_why(monkeypatch):
    # (None in sys.modules: importing it raises ImportError.  Every submodule
    # an earlier test imported too: "from stable_baselines3.common.vec_env
    # import ..." finds a loaded submodule without importing its parent.)
    hidden = ["pufferlib", "pufferlib.vector", "stable_baselines3"]
    hidden += [name for name in sys.modules if name.startswith(("pufferlib.", "stable_baselines3."))]
    for name in hidden:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(Unavailable, match=r"pufferlib not installed \(pip install"):
        bench_python.PufferRun("CartPole-v1", 4, 2)
    with pytest.raises(Unavailable, match=r"stable-baselines3 not installed \(pip install"):
        bench_python.SB3Run("CartPole-v1", 4)


def test_the_ceiling_steps_in_two_processes_and_stops_them():
    ceiling = bench_python.CeilingRun("CartPole-v1", 4)
    procs = [proc for proc, _ in ceiling.members]
    try:
        assert len(procs) == 2 and all(proc.is_alive() for proc in procs)
        assert ceiling.rate(0.05) > 0
        assert ceiling.rate(1e-6) > 0  # a window shorter than a step: still one step each
    finally:
        ceiling.close()
    assert not any(proc.is_alive() for proc in procs)


def synthetic(rounds: dict[str, dict[str, list[float]]]) -> dict:
    """Results of made-up rounds: {env: {system: values}}; systems absent are n/a."""
    table = {}
    for env_id, by_system in rounds.items():
        cells = {s: (by_system[s][0] if s in by_system else "n/a: pufferlib not installed")
                 for s in bench_python.SYSTEMS}
        table[env_id] = {"cells": cells, "rounds": by_system, "labels": {}}
    return {"num_envs": 16, "envs": list(rounds), "systems": list(bench_python.SYSTEMS),
            "descriptions": bench_python.DESCRIPTIONS, "table": table,
            "latency_us": {"env_id": "py:CartPole-v1", "daemon_path": "socket path"}}


def test_the_targets_are_ratios_taken_round_by_round():
    w, d, c, sync = (bench_python.ROW_WORKERS, bench_python.ROW_DEFAULT,
                     bench_python.CEILING, bench_python.GYM_SYNC)
    acrobot = {w: [40.0, 20.0, 40.0], c: [44.0, 22.0, 44.0],      # 0.91x every round
               bench_python.GYM_ASYNC: [25.0, 10.0, 10.0],        # 1.6x, 2x, 4x: straddles 2
               bench_python.ROW_DAEMON: [28.0, 14.0, 28.0],      # 0.7x: fails 0.8x
               d: [40.0, 20.0, 40.0], sync: [20.0, 10.0, 20.0]}
    cartpole = {d: [60.0, 61.0, 62.0], sync: [62.0, 61.0, 60.0]}  # 0.97x .. 1.03x
    found = {t["target"]: t for t in bench_python.targets(synthetic(
        {"Acrobot-v1": acrobot, "CartPole-v1": cartpole}))}
    assert len(found) == len(bench_python.TARGETS)
    status = {name.split(": ", 1)[1]: t["status"] for name, t in found.items()}
    assert status == {
        f"{w} >= 0.85x {c}": "PASS",
        f"{w} >= 2x {bench_python.GYM_ASYNC}": "NOT JUDGED",
        f"{w} >= 1.2x {bench_python.PUFFER}": "N/A",
        f"{bench_python.ROW_DAEMON} >= 0.8x {w}": "FAIL",
        f"{d} >= 0.95x {sync}": "PASS",
        f"{w} >= 1.6x {sync}": "PASS",  # 2x every round
        # (not measured here: N/A; the MuJoCo envs' lines share their texts)
        f"{bench_python.ROW_DAEMON_ONE} >= 0.9x {bench_python.ROW_ONE}": "N/A",
        f"{bench_python.ROW_SERIAL} >= 0.95x {sync}": "N/A",
        f"{w} >= 1x {bench_python.ENVPOOL}": "N/A",
    }, status  # (the two default-rule lines share a text: one per env)
    by_env = [t for t in found.values() if t["target"].endswith(f"{d} >= 0.95x {sync}")]
    assert sorted(t["target"].split()[0] for t in by_env) == ["Acrobot-v1", "CartPole-v1"]
    assert all(t["status"] == "PASS" for t in by_env)
    ceiling = next(t for t in found.values() if c in t["target"])
    assert ceiling["value"] == pytest.approx(40 / 44) and ceiling["spread"] == pytest.approx(0)
    puffer = next(t for t in found.values() if bench_python.PUFFER in t["target"])
    assert puffer["detail"] == "pufferlib not installed"
    # an env not measured at all: every line of it N/A
    only_cartpole = bench_python.targets(synthetic({"CartPole-v1": cartpole}))
    assert [t["status"] for t in only_cartpole if t["target"].startswith("Acrobot")] == \
        ["N/A"] * 7


def test_the_report_and_readme_table_of_made_up_results():
    r = synthetic({"Acrobot-v1": {s: [1000.0, 1100.0] for s in bench_python.SYSTEMS
                                  if s != bench_python.PUFFER},
                   "CartPole-v1": {s: [3000.0, 3300.0] for s in bench_python.SYSTEMS
                                   if s != bench_python.PUFFER}})
    r["table"]["Acrobot-v1"]["labels"] = {bench_python.ROW_DEFAULT: "2 workers"}
    for name in bench_python.LATENCY_SYSTEMS:
        r["latency_us"][name] = {"p50": 12.0, "p99": 30.0, "p50_rounds": [12.0, 12.0],
                                 "p99_rounds": [30.0, 30.0]}
    r["table"]["Acrobot-v1"]["cpu_us"] = {bench_python.GYM_SYNC: [[30.0, 0.0], [32.0, 0.0]],
                                          bench_python.ROW_WORKERS: [[4.0, 32.0], [4.0, 38.0]]}
    r["targets"] = bench_python.targets(r)
    text = bench_python.report(r)
    # caller + workers (medians), then the total's ratio to SyncVectorEnv's
    # round by round (36/30 and 42/32: 1.2 and 1.3125), "-" where not measured
    assert f"{bench_python.ROW_WORKERS:<34}{'4.0+35.0 1.26x':>22}{'-':>22}" in text
    assert f"{bench_python.GYM_SYNC:<34}{'31.0 1.00x':>22}{'-':>22}" in text
    assert f"  n/a {bench_python.PUFFER} on CartPole-v1: pufferlib not installed" in text
    assert f"{bench_python.ROW_DEFAULT} on Acrobot-v1: 2 workers" in text
    assert f"{bench_python.GYM_SYNC:<34}" + f"{'1.00x ±0.00':>16}" * 2 in text
    table = bench_python.readme_table(r)
    assert f"| {bench_python.PUFFER} | n/a | - | n/a | - |" in table
    assert f"| {bench_python.ROW_DEFAULT} (Acrobot-v1: 2 workers) | 1.05k ±5% | 1.00x |" \
        in table
    assert "envd daemon, 1 worker p50 12 us (p99 30 us)" in table
    assert f"| {bench_python.ROW_WORKERS} | 4.0+35.0 1.26x | - |" in table
    assert "- N/A: Acrobot-v1 N=16: " in table


def test_bad_options_are_refused(capsys):
    for argv in (["--python", "--num-envs", "3"], ["--python", "--num-envs", "0"],
                 ["--python", "--sizes", "64"], ["--python", "--threads", "2"],
                 ["--python", "--learner-envs", "8"], ["--num-envs", "16"],
                 ["--python", "--rounds", "0"]):
        with pytest.raises(SystemExit) as exit_info:
            cli.main(["bench", *argv])
        assert exit_info.value.code == 2, argv
        assert "envd bench:" in capsys.readouterr().err


def test_sigterm_stops_the_run_and_leaves_nothing(tmp_path):
    """A run killed with SIGTERM (a CI timeout, `kill`) stops its daemon and
    removes its temporary folder (envd.tools.bench_teardown)."""
    import signal
    import time

    tmp = tmp_path / "tmp"
    proc = subprocess.Popen(
        [sys.executable, "-m", "envd", "bench", "--python", "--quick", "--out",
         str(tmp_path / "results"), "--num-envs", str(NUM_ENVS), "--no-progress"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path,
        env=private_tmp(tmp))
    try:
        deadline = time.monotonic() + 300
        while not glob.glob(str(tmp / BENCH_FOLDERS)):  # its daemon is starting
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=300) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not glob.glob(str(tmp / BENCH_FOLDERS))
    assert not processes_naming(f"{tmp}/envd-bench-python-")
