"""`envd bench`: one short run against its own real daemons (--quick, N in
{1, 64}), then the report, the files and the progress bar are checked.  No
timing assertions: the numbers only have to exist."""
from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys

import pytest

from envd.tools import bench as benchmark
from envd.tools import cli

SIZES = [1, 64]
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
         "--sizes", *map(str, SIZES)],
        check=False, capture_output=True, text=True, timeout=300, cwd=out.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, out


def table_lines(stdout: str) -> list[str]:
    section = stdout.split("env steps per second (best of rounds)\n", 1)[1]
    return section.split("\n\n", 1)[0].splitlines()


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
        system, threads, cells = line[:26].strip(), line[26:34].strip(), line[34:].split()
        seen.append((system, "auto" if threads.startswith("auto") else threads))
        if cells[:1] == ["n/a"]:
            assert may_be_missing(system), line
            assert line[34:].strip().startswith("n/a (") and line.endswith(")"), line
            continue
        assert len(cells) == len(SIZES), line
        for n, cell in zip(SIZES, cells):
            if cell == "-":  # not a configuration at this N
                assert system == "EnvPool async" and n == 1, line
            elif cell == "n/a":
                assert may_be_missing(system), line
            else:
                assert cell[0].isdigit(), line
    assert seen == benchmark.ROWS
    for heading in ("round trip of one step at N=1", "thread sweep, envd in-process",
                    "clients stepping at once through one daemon", "ratios", "targets"):
        assert heading in stdout
    target_lines = stdout.split("\ntargets\n", 1)[1].split("\n\n", 1)[0].splitlines()
    # latency (2), daemon vs in-process and EnvPool (2), auto threads (2 envs x N), clients (1)
    assert len(target_lines) == 2 + 2 + 2 * len(SIZES) + 1, target_lines
    assert all(line.split()[0] in ("PASS", "FAIL", "N/A") for line in target_lines)
    assert "N=4096 not in --sizes" in stdout


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
    assert {t["status"] for t in results["targets"]} <= {"PASS", "FAIL", "N/A"}
    csv_lines = (out / "results.csv").read_text().splitlines()
    assert csv_lines[0].startswith("section,env_id,system,threads,num_envs,steps_per_second")
    assert len(csv_lines) > len(benchmark.ROWS) * len(SIZES)
    assert (out / "report.txt").read_text().strip()


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


def synthetic(fast_p50: float | str, pool_p50: float, daemon: float, inprocess: float,
              pool: float, auto: float, best_fixed: float, many: float, one: float) -> dict:
    def row(system, threads, value):
        return {"system": system, "threads": threads, "cells": {n: value for n in (1024, 4096)}}
    table = [row("envd in-process", "auto", inprocess), row("envd daemon socket", "auto", daemon),
             row("envd fast path", "auto", "n/a: fast path not available: x"),
             row("EnvPool sync", "1", pool), row("EnvPool sync", "auto", pool / 2)]
    fast = fast_p50 if isinstance(fast_p50, str) else {"p50": fast_p50, "p99": 2 * fast_p50}
    return {"sizes": [1024, 4096], "table": table,
            "latency_us": {"envd fast path": fast, "EnvPool sync": {"p50": pool_p50}},
            "thread_sweep": {"CartPole-v1": {"0": {1024: best_fixed, 4096: best_fixed / 2},
                                             "auto": {1024: auto, 4096: auto}}},
            "scaling": {"steps_per_second": {"1x4096": one, "4x1024": many}}}


def test_the_targets_are_judged_from_the_numbers():
    passing = benchmark.targets(synthetic(10.0, 40.0, 9.5, 10.0, 1.0, 0.96, 1.0, 8.5, 10.0))
    assert [t["status"] for t in passing] == ["PASS"] * 7, passing
    failing = benchmark.targets(synthetic(16.0, 20.0, 8.0, 10.0, 2.0, 0.9, 1.0, 7.0, 10.0))
    assert [t["status"] for t in failing] == ["FAIL", "FAIL", "FAIL", "FAIL", "FAIL", "PASS",
                                              "FAIL"], failing
    missing = benchmark.targets(synthetic("n/a: fast path not available: no", 40.0, 9.5, 10.0,
                                          1.0, 0.96, 1.0, 8.5, 10.0))
    assert [t["status"] for t in missing[:2]] == ["N/A", "N/A"]
    assert missing[0]["detail"] == "fast path not available: no"


def test_bad_options_are_refused(capsys):
    for argv in (["--rounds", "0"], ["--seconds", "0"], ["--sizes", "0"], ["--threads", "0"]):
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
