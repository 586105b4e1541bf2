"""`envd bench`: one short run against its own real daemons (--quick, N in
{1, 64}, the learner comparison at N=8), then the report, the files and the
progress bar are checked; the pieces of an honest benchmark (interleaved
rounds, spread, NOT JUDGED, the load warning, the learner comparison's
targets) on made-up inputs.  No timing assertions: the numbers only have to
exist."""
from __future__ import annotations

import ctypes
import importlib.util
import io
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from envd.tools import bench as benchmark
from envd.tools import bench_learner, bench_load, bench_multi, bench_rounds, cli

SIZES = [1, 64]
LEARNER_ENVS = 8
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
HAS_ENVPOOL = importlib.util.find_spec("envpool") is not None
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
THREADED = {system for system, threads in benchmark.ROWS if threads != "-"}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """`envd bench --quick` with stderr a pipe (not a terminal)."""
    out = tmp_path_factory.mktemp("bench") / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "envd", "bench", "--quick", "--out", str(out),
         "--sizes", *map(str, SIZES), "--learner-envs", str(LEARNER_ENVS)],
        check=False, capture_output=True, text=True, timeout=300, cwd=out.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, out


def table_lines(stdout: str) -> list[str]:
    section = stdout.split("env steps per second (median of rounds, ± half their range)\n", 1)[1]
    return section.split("\n\n", 1)[0].splitlines()


def cells_of(text: str) -> list[str]:
    """The table's cells of one line after its system and threads columns."""
    width = benchmark.CELL
    return [text[i:i + width].strip() for i in range(0, len(text), width)]


def is_rate_with_spread(cell: str) -> bool:
    """'24.1M ±3%': a median and its relative half-range."""
    rate, _, spread = cell.partition(" ±")
    return rate[:1].isdigit() and spread.endswith("%") and spread[:-1].isdigit()


def may_be_missing(system: str) -> bool:
    """Rows that may be n/a: the fast path (another issue), peers not installed."""
    return system == "envd fast path" or (system.startswith("EnvPool") and not HAS_ENVPOOL)


def test_the_table_has_every_row_and_column(run):
    proc, _ = run
    stdout = proc.stdout
    assert "CPU:" in stdout and "load average" in stdout  # the machine, at the top
    header, *rows = table_lines(stdout)
    assert header.split()[2:] == [f"N={n}" for n in SIZES]
    seen = []
    for line in rows:
        if line.startswith("  "):  # the notes under the table
            continue
        system, threads, cells = line[:26].strip(), line[26:34].strip(), cells_of(line[34:])
        seen.append((system, "auto" if threads.startswith("auto") else threads))
        if line[34:].strip().startswith("n/a ("):  # a whole row not measured, and why
            assert may_be_missing(system), line
            assert line.endswith(")"), line
            continue
        assert len(cells) == len(SIZES), line
        for n, cell in zip(SIZES, cells):
            if cell == "-":  # not a configuration at this N
                assert system == "EnvPool async" and n == 1, line
            elif cell == "n/a":
                assert may_be_missing(system), line
            else:
                assert is_rate_with_spread(cell), line
    assert seen == benchmark.ROWS
    for heading in ("round trip of one step at N=1", "thread sweep, envd in-process",
                    "clients stepping at once through one daemon", "ratios", "targets"):
        assert heading in stdout
    target_lines = stdout.split("\ntargets (", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    # latency (2), daemon vs in-process and EnvPool (2), auto threads (2 envs x N), clients (1),
    # the capped pair (1), the learner: per env, in-process and daemon, against its target
    # and against EnvPool
    learner = len(bench_learner.LEARNER_ENVS) * 2 * 2
    multi = len(bench_multi.MULTI_ENVS)  # async over two daemons: one per env
    assert len(target_lines) == 2 + 2 + 2 * len(SIZES) + 1 + 1 + learner + multi, target_lines
    statuses = ("PASS", "FAIL", "NOT JUDGED", "N/A")
    assert all(line[2:14].strip() in statuses for line in target_lines), target_lines
    assert "N=4096 not in --sizes" in stdout
    # the machine's load: a warning or the quiet figures, both from measured numbers
    assert "WARNING: the machine was loaded" in stdout or "machine load: quiet" in stdout


def test_the_learner_section_has_every_env_and_system(run):
    proc, _ = run
    section = proc.stdout.split("\nasync with a learner", 1)[1].split("\ntargets (", 1)[0]
    for env_id in bench_learner.LEARNER_ENVS:
        head = f"{env_id}: N={LEARNER_ENVS}, batch {LEARNER_ENVS // 2}, learner T = "
        assert head in section
        block = section.split(head, 1)[1].split("\n\n", 1)[0].splitlines()[2:]
        systems = [line[2:20].strip() for line in block]
        expected = [s for s in bench_learner.SYSTEMS for _ in bench_learner.LEARNERS]
        if env_id == "ConnectFour-v0" or not HAS_ENVPOOL:  # EnvPool: one n/a line
            expected = expected[:-1]
        assert systems == expected, block
        for line in block:
            if line[2:20].strip() == "EnvPool" and "n/a (" in line:
                continue
            learner, sync, asyn, ratio = line[20:28].strip(), line[28:42], line[42:56], line[56:]
            assert learner in bench_learner.LEARNERS, line
            assert is_rate_with_spread(sync.strip()) and is_rate_with_spread(asyn.strip()), line
            assert ratio.strip().endswith(tuple("0123456789")) and "x ±" in ratio, line


def test_the_section_over_two_daemons_has_every_env(run):
    proc, out = run
    section = proc.stdout.split("\nasync over two daemons on this host", 1)[1]
    section = section.split("\ntargets (", 1)[0].splitlines()
    rows = [line for line in section if line[2:16].strip() in bench_multi.MULTI_ENVS]
    assert [line[2:16].strip() for line in rows] == list(bench_multi.MULTI_ENVS), section
    for line in rows:
        rates = [line[i:i + 14].strip() for i in (22, 36, 50)]
        ratio = line[64:].strip()
        assert all(is_rate_with_spread(rate) for rate in rates), line
        assert "x ±" in ratio, line
    assert "(one daemon: " in "\n".join(section) and "; two daemons: " in "\n".join(section)
    results = json.loads((out / "results.json").read_text())
    for env_id in bench_multi.MULTI_ENVS:
        entry = results["multi_async"][env_id]
        assert entry["num_envs"] == LEARNER_ENVS and entry["batch_size"] == LEARNER_ENVS // 2
        for system in bench_multi.SYSTEMS:
            values = entry["rounds"][system]
            assert len(values) == results["settings"]["rounds"] and min(values) > 0
    names = [t["target"] for t in results["targets"]]
    assert all(any(name.startswith(f"{env_id} async, two daemons") for name in names)
               for env_id in bench_multi.MULTI_ENVS)
    csv_lines = (out / "results.csv").read_text().splitlines()
    rows = [line for line in csv_lines if line.startswith("multi_async,")]
    assert len(rows) == len(bench_multi.MULTI_ENVS) * len(bench_multi.SYSTEMS), rows


def test_the_json_has_numbers_for_envd(run):
    _, out = run
    results = json.loads((out / "results.json").read_text())
    assert results["sizes"] == SIZES
    rows = {(row["system"], row["threads"]): row["cells"] for row in results["table"]}
    for system in ("envd in-process", "envd daemon socket"):
        for threads in ("1", "auto"):
            assert all(isinstance(rows[(system, threads)][str(n)], float)
                       and rows[(system, threads)][str(n)] > 0 for n in SIZES)
    for threads in ("1", "auto"):  # the fast path: numbers, or why not
        for n in SIZES:
            cell = rows[("envd fast path", threads)][str(n)]
            assert (isinstance(cell, float) and cell > 0) or \
                cell.startswith("n/a: fast path not available"), cell
    for env_id, by_threads in results["thread_sweep"].items():
        assert set(by_threads) >= {"0", "1", "auto"}
        assert all(v > 0 for cells in by_threads.values() for v in cells.values()), env_id
    assert set(results["thread_sweep"]) == {"CartPole-v1", "Acrobot-v1"}
    assert all(v > 0 for v in results["scaling"]["steps_per_second"].values())
    latency = results["latency_us"]
    assert latency["envd daemon socket"]["p50"] > 0
    assert latency["envd in-process"]["p99"] >= latency["envd in-process"]["p50"] > 0
    assert {t["status"] for t in results["targets"]} <= {"PASS", "FAIL", "NOT JUDGED", "N/A"}
    # every cell keeps its rounds, and the cell is their median
    for row in results["table"]:
        for n, values in row["rounds"].items():
            assert len(values) == results["settings"]["rounds"]
            assert row["cells"][n] == bench_rounds.spread(values).median
    load = results["machine"]["load"]
    assert load["cpus"] >= 1 and load["seconds"] > 0 and load["loaded"] == bool(load["reasons"])
    for env_id in bench_learner.LEARNER_ENVS:
        entry = results["learner"][env_id]
        assert entry["num_envs"] == LEARNER_ENVS and entry["batch_size"] == LEARNER_ENVS // 2
        assert entry["learner_seconds_per_env"] > 0
        for system in ("envd in-process", "envd daemon"):
            for learner in bench_learner.LEARNERS:
                for mode in bench_learner.MODES:
                    values = entry["rounds"][system][learner][mode]
                    assert len(values) == results["settings"]["rounds"] and min(values) > 0
        assert ("EnvPool" in entry["rounds"]) == (HAS_ENVPOOL and env_id != "ConnectFour-v0")
    csv_lines = (out / "results.csv").read_text().splitlines()
    assert csv_lines[0].startswith("section,env_id,system,threads,num_envs,steps_per_second")
    assert len(csv_lines) > len(benchmark.ROWS) * len(SIZES)
    assert any(line.startswith("learner,Acrobot-v1,envd daemon,") for line in csv_lines)
    assert (out / "report.txt").read_text().strip()


def test_the_readme_section_is_the_runs_figures(run):
    """readme_table.md (pasted into the README) holds this run's medians and
    ratios, computed from results.json independently of bench_readme.py."""
    _, out = run
    results = json.loads((out / "results.json").read_text())
    text = (out / "readme_table.md").read_text()
    assert f"{results['machine']['usable_cpus']} usable CPUs" in text
    assert f"median of {results['settings']['rounds']} interleaved rounds" in text
    rows = {(row["system"], row["threads"]): row for row in results["table"]}
    inproc = rows[("envd in-process", "auto")]
    line = next(x for x in text.splitlines() if x.startswith("| envd in-process"))
    cells = [c.strip() for c in line.strip("|").split("|")[1:]]
    assert cells == [bench_rounds.spread_text(inproc["rounds"][str(n)]) for n in SIZES], line
    for env_id in bench_learner.LEARNER_ENVS:
        entry = results["learner"][env_id]
        sync = entry["rounds"]["envd daemon"]["sleep"]["sync"]
        asyn = entry["rounds"]["envd daemon"]["sleep"]["async"]
        ratio = bench_rounds.ratio_text([a / b for a, b in zip(asyn, sync)])
        line = next(x for x in text.splitlines() if x.startswith(f"| {env_id} | sleep |"))
        assert line.split("|")[4].strip() == ratio, line
    assert text.count("\n- ") == len(results["targets"])


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib not installed")
def test_the_plot_is_a_png(run):
    _, out = run
    assert (out / "steps_per_second.png").read_bytes()[:8] == PNG_MAGIC


def test_no_progress_bar_when_stderr_is_not_a_terminal(run):
    proc, _ = run
    assert "\r" not in proc.stderr and "] " not in proc.stderr, proc.stderr[-2000:]


# ---- pieces, without a daemon --------------------------------------------------------------
class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_bar_draws_on_a_terminal_only():
    stream = Terminal()
    bar = benchmark.Progress(4, stream=stream)
    bar.advance()
    bar.show("envd daemon N=1024")
    assert stream.getvalue() == f"\r[{'#' * 7}{'.' * 23}] 1/4 envd daemon N=1024"
    bar.close()
    assert stream.getvalue().endswith("\r")
    for quiet in (benchmark.Progress(4, stream=io.StringIO()),
                  benchmark.Progress(4, stream=Terminal(), enabled=False)):
        quiet.show("x")
        quiet.close()
        assert quiet.stream.getvalue() == ""


def test_without_matplotlib_it_says_so(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import raises ImportError
    assert "matplotlib not installed" in benchmark.plot({}, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def synthetic(fast_p50: list[float] | str, pool_p50: list[float], daemon: list[float],
              inprocess: list[float], pool: list[float], auto: list[float],
              best_fixed: list[float], many: list[float], one: list[float]) -> dict:
    """Results with made-up rounds (each argument: one value per round)."""
    def row(system, threads, values):
        if isinstance(values, str):
            return {"system": system, "threads": threads, "cells": {1024: values, 4096: values},
                    "rounds": {}}
        return {"system": system, "threads": threads, "cells": dict.fromkeys((1024, 4096), 0.0),
                "rounds": dict.fromkeys((1024, 4096), values)}
    table = [row("envd in-process", "auto", inprocess), row("envd daemon socket", "auto", daemon),
             row("envd fast path", "auto", "n/a: fast path not available: x"),
             row("EnvPool sync", "1", pool), row("EnvPool sync", "auto", [v / 2 for v in pool])]
    fast = fast_p50 if isinstance(fast_p50, str) else {"p50_rounds": fast_p50}
    return {"sizes": [1024, 4096], "table": table,
            "latency_us": {"envd fast path": fast, "EnvPool sync": {"p50_rounds": pool_p50}},
            "thread_sweep_rounds": {"CartPole-v1": {
                "0": {1024: best_fixed, 4096: [v / 2 for v in best_fixed]},
                "auto": {1024: auto, 4096: auto}}},
            "scaling": {"rounds": {"1x4096": one, "4x1024": many}}}


def test_the_targets_are_judged_from_the_rounds():
    steady = synthetic([10.0] * 3, [40.0] * 3, [9.5] * 3, [10.0] * 3, [1.0] * 3, [0.96] * 3,
                       [1.0] * 3, [8.5] * 3, [10.0] * 3)
    assert [t["status"] for t in benchmark.targets(steady)] == ["PASS"] * 7
    failing = benchmark.targets(synthetic([16.0] * 2, [20.0] * 2, [8.0] * 2, [10.0] * 2,
                                          [2.0] * 2, [0.9] * 2, [1.0] * 2, [7.0] * 2, [10.0] * 2))
    assert [t["status"] for t in failing] == ["FAIL", "FAIL", "FAIL", "FAIL", "FAIL", "PASS",
                                              "FAIL"], failing
    # The same medians, but rounds that straddle each limit: not judged.
    noisy = benchmark.targets(synthetic(
        [10.0, 14.0, 20.0], [40.0, 28.0, 20.0], [8.0, 9.5, 10.0], [10.0] * 3, [1.0] * 3,
        [0.8, 0.96, 1.1], [1.0] * 3, [6.0, 8.5, 9.0], [10.0] * 3))
    assert [t["status"] for t in noisy] == ["NOT JUDGED"] * 3 + ["PASS", "NOT JUDGED", "PASS",
                                                                "NOT JUDGED"], noisy
    assert noisy[0]["value"] == 14.0 and noisy[0]["spread"] == 5.0 and noisy[0]["margin"] == 1.0
    # The ratio is taken round by round: a load burst in round 2 hits both sides.
    paired = benchmark.targets(synthetic([10.0] * 3, [40.0] * 3, [9.5, 4.75, 9.5],
                                         [10.0, 5.0, 10.0], [1.0] * 3, [0.96] * 3, [1.0] * 3,
                                         [8.5] * 3, [10.0] * 3))
    assert paired[2]["status"] == "PASS" and paired[2]["spread"] == 0.0, paired[2]
    missing = benchmark.targets(synthetic("n/a: fast path not available: no", [40.0], [9.5],
                                          [10.0], [1.0], [0.96], [1.0], [8.5], [10.0]))
    assert [t["status"] for t in missing[:2]] == ["N/A", "N/A"]
    assert missing[0]["detail"] == "fast path not available: no"


# ---- the honest-benchmark pieces, on made-up inputs ----------------------------------------
def test_rounds_interleave_the_systems():
    calls = []
    values = bench_rounds.interleaved_rounds(
        ["A", "B", "C"], 3, lambda key, r: calls.append((r, key)) or 10.0 * r + ord(key),
        shuffle=None)
    assert calls == [(r, k) for r in range(3) for k in "ABC"]
    assert values == {k: [ord(k), 10.0 + ord(k), 20.0 + ord(k)] for k in "ABC"}
    # shuffled: a different order inside each round, still one of each per round
    calls.clear()
    bench_rounds.interleaved_rounds(["A", "B", "C"], 4,
                                    lambda key, r: calls.append((r, key)) or 1.0,
                                    shuffle=lambda order: order.reverse())
    assert calls == [(r, k) for r in range(4) for k in ("CBA" if r % 2 == 0 else "ABC")]
    with pytest.raises(ValueError):
        bench_rounds.interleaved_rounds(["A"], 0, lambda key, r: 1.0)


class RecordingRun:
    """A run object of Bench.measure_group that records when it is measured."""

    def __init__(self, name: str, calls: list):
        self.name, self.calls, self.closed = name, calls, False

    def rate(self, seconds: float) -> float:
        self.calls.append(self.name)
        return float(len(self.calls))

    def close(self) -> None:
        self.closed = True


def test_the_table_measures_round_by_round(monkeypatch):
    settings = benchmark.Settings(rounds=3, seconds=0.01, progress=False)
    bench = benchmark.Bench(settings)
    calls: list[str] = []
    runs = {}

    def factory(name):
        def make():
            runs[name] = RecordingRun(name, calls)
            return runs[name]
        return make

    keys = [("A", "1"), ("B", "1"), ("C", "-")]
    monkeypatch.setattr(bench, "configs", lambda env_id, n: {k: factory(k[0]) for k in keys})
    results = bench.measure_group("CartPole-v1", 64)
    # every round measures each system once before the next round starts
    assert [sorted(calls[i:i + 3]) for i in range(0, 9, 3)] == [["A", "B", "C"]] * 3
    for key in keys:  # every round's value kept, in round order
        assert len(results[key]) == 3 and results[key] == sorted(results[key])
    assert all(run.closed for run in runs.values())


def test_the_learner_comparison_measures_round_by_round(monkeypatch):
    calls = []

    class FakePair:
        def __init__(self, system):
            self.system = system
            self.sync_env, self.async_env = SimpleNamespace(fast_path=True), SimpleNamespace()

        def sync_step_seconds(self):
            return 0.001

        def sync_rate(self, learner, per_env, seconds, slack):
            assert slack == 42e-6  # the measured overshoot
            calls.append((self.system, learner, "sync"))
            return 100.0

        def async_rate(self, learner, per_env, seconds, slack):
            assert slack == 42e-6
            calls.append((self.system, learner, "async"))
            return 150.0 if self.system == "envd in-process" else 120.0

        def close(self):
            calls.append((self.system, "closed"))

    systems = ("envd in-process", "envd daemon", "EnvPool")
    monkeypatch.setattr(bench_learner, "make_pairs", lambda env_id, n, client: (
        {s: FakePair(s) for s in systems}, {}))
    monkeypatch.setattr(bench_learner, "sleep_overshoot", lambda: 42e-6)
    entry = bench_learner.measure_env("Acrobot-v1", 64, None, rounds=2, seconds=0.01)
    assert entry["sleep_overshoot_seconds"] == 42e-6
    per_round = len(systems) * len(bench_learner.LEARNERS) * len(bench_learner.MODES)
    measured = [c for c in calls if c[1] != "closed"]
    assert len(measured) == 2 * per_round
    assert len(set(measured[:per_round])) == per_round == len(set(measured[per_round:]))
    assert entry["learner_seconds_per_env"] == 0.001 / 64
    assert entry["rounds"]["envd daemon"]["busy"]["async"] == [120.0, 120.0]
    assert entry["daemon_path"] == {"sync": "fast path", "async": "unknown"}
    assert sum(c[1] == "closed" for c in calls) == len(systems)
    found = {t["target"]: t for t in bench_learner.targets({"Acrobot-v1": entry})}
    mine = found["Acrobot-v1 sleep learner, envd in-process: async >= 1.6x sync"]
    assert mine["status"] == "FAIL" and mine["value"] == 1.5
    ahead = found["Acrobot-v1 sleep learner, envd in-process: async/sync >= EnvPool's async/sync"]
    assert ahead["status"] == "PASS" and ahead["value"] == 1.25


@pytest.mark.skipif(sys.platform != "linux", reason="the timer slack is Linux's")
def test_the_learner_measures_with_a_fine_timer_slack_and_restores_it():
    """Inside fine_timer_slack the thread's timer slack is 1 ns (so that a
    short sleep ends close to when asked, whatever the default); after, it
    is what it was."""
    libc = ctypes.CDLL(None, use_errno=True)
    before = libc.prctl(bench_learner._PR_GET_TIMERSLACK, 0, 0, 0, 0)
    assert before >= 0
    with bench_learner.fine_timer_slack():
        assert libc.prctl(bench_learner._PR_GET_TIMERSLACK, 0, 0, 0, 0) == 1
        assert bench_learner.sleep_overshoot(samples=10) >= 0
    assert libc.prctl(bench_learner._PR_GET_TIMERSLACK, 0, 0, 0, 0) == before


def test_the_sleeping_learner_ends_its_sleep_slack_early():
    """learn sleeps seconds - slack (the measured overshoot) and spins the
    rest; with no room for a sleep, it only spins."""
    slept = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bench_learner, "time", SimpleNamespace(
            sleep=slept.append, perf_counter=bench_learner.time.perf_counter))
        bench_learner.learn(300e-6, "sleep", slack=100e-6)
        bench_learner.learn(50e-6, "sleep", slack=100e-6)
        bench_learner.learn(300e-6, "busy", slack=100e-6)
    assert slept == [pytest.approx(200e-6)]


def test_the_comparison_over_two_daemons_measures_round_by_round(monkeypatch):
    calls = []

    class FakeLoop:
        def __init__(self, env):
            self.env = env

        def rate(self, seconds):
            calls.append(self.env.system)
            if self.env.system == "two daemons":
                return 95.0 - len(calls) % 2
            return 100.0

        def close(self):
            calls.append(("closed", self.env.system))

    class FakeClient:
        def __init__(self, system):
            self.system = system

        def make(self, env_id, num_envs, seed, batch_size, fast_path=None):
            assert batch_size == num_envs // 2
            system = self.system if fast_path is None else "one daemon socket"
            return SimpleNamespace(system=system, fast_path=system == "one daemon")

    monkeypatch.setattr(bench_multi, "AsyncLoop", FakeLoop)
    results = bench_multi.measure(FakeClient("one daemon"), FakeClient("two daemons"), 64,
                                  rounds=3, seconds=0.01, env_ids=("CartPole-v1",))
    measured = [c for c in calls if isinstance(c, str)]
    assert len(measured) == 9  # every system once per round, rounds interleaved
    assert all(sorted(measured[i:i + 3]) == sorted(bench_multi.SYSTEMS) for i in (0, 3, 6))
    assert sum(isinstance(c, tuple) for c in calls) == 3  # every env closed
    entry = results["CartPole-v1"]
    assert entry["num_envs"] == 64 and entry["batch_size"] == 32
    assert entry["paths"] == {"one daemon": "fast path", "one daemon socket": "socket path",
                              "two daemons": "socket path"}
    (target,) = bench_multi.targets(results)
    assert target["status"] == "PASS" and 0.94 <= target["value"] <= 0.95, target
    slow = {"CartPole-v1": {**entry, "rounds": {**entry["rounds"], "two daemons": [50.0] * 3}}}
    assert bench_multi.targets(slow)[0]["status"] == "FAIL"
    noisy = {"CartPole-v1": {**entry, "rounds": {**entry["rounds"],
                                                 "two daemons": [70.0, 90.0, 110.0]}}}
    assert bench_multi.targets(noisy)[0]["status"] == "NOT JUDGED"
    lines = bench_multi.report_lines(results, 2, 1)
    assert "one daemon of 2 threads (its default path, and its socket path) vs two of 1" \
        in lines[0]
    assert lines[2].split()[:2] == ["CartPole-v1", "64"]
    assert bench_multi.summary(results)["CartPole-v1"]["summary"]["two_over_one"]["median"] > 0


def test_wide_ratio_cells_stay_apart():
    """The ratios' cells: '47.34x ±20.19' fills a whole one, yet it still
    reads apart from the cell before it (a run printed '±9.2647.34x')."""
    line = benchmark.ratio_cells(["19.38x ±9.26", "47.34x ±20.19", "-"])
    assert line.split() == ["19.38x", "±9.26", "47.34x", "±20.19", "-"]
    assert len(benchmark.ratio_cells(["1.00x ±0.01", "-"])) == 2 * benchmark.CELL  # (aligned)


def test_spread_and_not_judged():
    s = bench_rounds.spread([3.0, 1.0, 2.0, 10.0])
    assert (s.median, s.low, s.high, s.rounds) == (2.5, 1.0, 10.0, 4)
    assert s.half_range == 4.5 and s.relative == 1.8
    assert (s.q1, s.q3) == (1.75, 4.75)
    one = bench_rounds.spread([7.0])
    assert (one.median, one.q1, one.q3, one.half_range) == (7.0, 7.0, 7.0, 0.0)
    with pytest.raises(ValueError):
        bench_rounds.spread([])
    judge = bench_rounds.judge
    assert judge([1.7, 1.8, 1.9], ">=", 1.6)["status"] == "PASS"    # margin 0.2 > spread 0.1
    assert judge([1.3, 1.4, 1.5], ">=", 1.6)["status"] == "FAIL"
    assert judge([1.5, 1.7, 1.9], ">=", 1.6)["status"] == "NOT JUDGED"  # spread 0.2 > 0.1
    assert judge([1.4, 1.5, 1.9], ">=", 1.6)["status"] == "NOT JUDGED"  # even a median below
    assert judge([10.0, 12.0, 14.0], "<=", 15.0)["status"] == "PASS"
    assert judge([10.0, 16.0, 22.0], "<=", 15.0)["status"] == "NOT JUDGED"
    assert judge([1.6], ">=", 1.6)["status"] == "PASS"  # on the limit, no spread: met
    assert judge(None, ">=", 1.0)["status"] == judge([], ">=", 1.0)["status"] == "N/A"
    with pytest.raises(ValueError):
        judge([1.0], ">", 1.0)
    assert bench_rounds.paired_ratios([2.0, 4.0, 6.0], [1.0, 0.0, 3.0]) == [2.0, 2.0]
    with pytest.raises(ValueError):
        bench_rounds.paired_ratios([1.0], [1.0, 2.0])
    assert bench_rounds.spread_text([20e6, 24.1e6, 26e6]) == "24.1M ±12%"
    assert bench_rounds.ratio_text([1.2, 1.25, 1.3]) == "1.25x ±0.05"


def sample(wall, busy, own, steal=0.0, load=0.0):
    return bench_load.CpuSample(wall=wall, busy=busy, steal=steal, own=own, load_average=load)


def test_the_load_warning():
    quiet = bench_load.assess(sample(0, 100, 5), sample(10, 118, 22), cpus=2)
    assert not quiet.loaded and quiet.warning() is None
    assert quiet.other_fraction == pytest.approx(1 / 20)  # 1 CPU-second of others in 20
    busy = bench_load.assess(sample(0, 100, 5), sample(10, 120, 10, load=0.0), cpus=2)
    assert busy.loaded and busy.other_fraction == pytest.approx(15 / 20)
    assert "other processes used 75% of the 2 usable CPU(s)" in busy.warning()
    stolen = bench_load.assess(sample(0, 0, 0, steal=1.0), sample(10, 5, 5, steal=3.0), cpus=2)
    assert stolen.reasons == ("the hypervisor stole 10% of their time",)
    before = bench_load.assess(sample(0, 0, 0, load=1.5), sample(10, 5, 5), cpus=2)
    assert before.reasons == ("load average 1.50 before the run on 2 CPU(s)",)
    # our own work never counts as load, even when the counters tick unevenly
    own = bench_load.assess(sample(0, 100, 0), sample(10, 110, 12), cpus=1)
    assert own.other_fraction == 0.0 and not own.loaded


def test_the_load_counters_are_read_from_proc_text():
    stat = ("cpu  9 9 9 9 9 9 9 9 9 9\n"
            "cpu0 100 10 50 1000 7 3 2 5 0 0\n"
            "cpu1 200 0 100 2000 0 0 0 1 0 0\n"
            "cpu2 999 999 999 999 999 999 999 999 0 0\n")
    busy, steal = bench_load.parse_proc_stat(stat, {0, 1}, ticks=100.0)
    assert busy == pytest.approx((100 + 10 + 50 + 3 + 2 + 200 + 100) / 100)
    assert steal == pytest.approx(6 / 100)

    def pid_stat(pid, ppid, utime, stime, cutime, cstime, name="python"):
        return (f"{pid} ({name}) S {ppid} 1 1 0 -1 0 0 0 0 0 {utime} {stime} {cutime} {cstime} "
                "20 0 1 0 0 0 0")
    stats = {10: pid_stat(10, 1, 5, 5, 100, 0),      # the benchmark (a reaped daemon: 100)
             11: pid_stat(11, 10, 7, 3, 0, 0, "envd ) x"),  # a live daemon; odd name
             12: pid_stat(12, 11, 1, 1, 0, 0),       # its child
             20: pid_stat(20, 1, 500, 500, 0, 0),    # someone else
             21: "garbage"}
    assert bench_load.tree_ticks(10, stats) == 110 + 10 + 2
    assert bench_load.sample() is None or bench_load.sample().own > 0


def test_bad_options_are_refused(capsys):
    for argv in (["--rounds", "0"], ["--seconds", "0"], ["--sizes", "0"], ["--threads", "0"],
                 ["--learner-envs", "0"], ["--learner-envs", "7"]):
        with pytest.raises(SystemExit) as exit_info:
            cli.main(["bench", *argv])
        assert exit_info.value.code == 2
        assert "envd bench:" in capsys.readouterr().err


class FakeEnv:
    def __init__(self, **attributes):
        self.__dict__.update(attributes)
        self.closed = False

    def close(self):
        self.closed = True


def test_a_fast_path_row_without_a_fast_path_says_why():
    import envd

    class OldClient:  # before the fast path: no such option
        def make(self, env_id, num_envs, *, seed=None, **env_kwargs):
            assert not env_kwargs
            return FakeEnv()

    with pytest.raises(benchmark.Unavailable, match="Client.make has no fast_path option"):
        benchmark.remote_env(OldClient(), "CartPole-v1", 4, True)
    assert isinstance(benchmark.remote_env(OldClient(), "CartPole-v1", 4, False), FakeEnv)

    made = []

    class NewClient:
        def __init__(self, env_attributes, refuse=False):
            self.env_attributes, self.refuse = env_attributes, refuse

        def make(self, env_id, num_envs, *, seed=None, fast_path=None):
            if fast_path and self.refuse:
                raise envd.EnvdError("the daemon offers no fast path")
            made.append(FakeEnv(**self.env_attributes))
            return made[-1]

    with pytest.raises(benchmark.Unavailable, match="the daemon offers no fast path"):
        benchmark.remote_env(NewClient({}, refuse=True), "CartPole-v1", 4, True)
    with pytest.raises(benchmark.Unavailable, match="has no fast_path attribute"):
        benchmark.remote_env(NewClient({}), "CartPole-v1", 4, True)
    with pytest.raises(benchmark.Unavailable, match="has fast_path=False"):
        benchmark.remote_env(NewClient({"fast_path": False}), "CartPole-v1", 4, True)
    assert all(env.closed for env in made)  # what it made and could not use is closed
    env = benchmark.remote_env(NewClient({"fast_path": True}), "CartPole-v1", 4, True)
    assert env.fast_path and not env.closed


def test_the_capped_pair_section_and_its_target(run):
    """The quick run measures the capped pair: both configurations with a
    rate per session and a pair total, the ratios, a target line, CSV rows."""
    proc, out = run
    section = proc.stdout.split("\na cheap session capped at max_threads=0", 1)[1]
    section = section.split("\nratios (", 1)[0].splitlines()
    rows = {line.split(" (max_threads")[0].strip(): line for line in section
            if "(max_threads=" in line}
    assert set(rows) == {"capped", "uncapped"}, section
    for line in rows.values():
        cells = line.split(")", 1)[1].rsplit("(", 1)[0].split()
        assert len(cells) == 6 and all(is_rate_with_spread(" ".join(cells[i:i + 2]))
                                       for i in (0, 2, 4)), line
    assert any(line.strip().startswith("capped / uncapped") and "x ±" in line
               for line in section)
    assert "pair total >= 1.0x uncapped:" in proc.stdout.split("\ntargets (", 1)[1]
    results = json.loads((out / "results.json").read_text())
    assert set(results["capped_pair"]["totals"]) == {"capped", "uncapped"}
    assert "capped_pair" in (out / "results.csv").read_text()
