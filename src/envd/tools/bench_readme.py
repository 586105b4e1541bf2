"""The README's benchmark section, written by ``envd bench`` as readme_table.md.

The README shows the figures of one ``envd bench`` run, pasted from this
file, so that they are never edited by hand: the machine line, the table of
CartPole-v1 env steps per second (threads auto), the round trip of one step,
the async-with-learner ratios and the target lines, each figure the median
over the run's interleaved rounds with its spread (bench_rounds.py).
"""
from __future__ import annotations

from typing import Any

from envd.tools import bench_learner
from envd.tools.bench_rounds import ratio_text, spread_text

#: The README table's rows: (system in the results' table, its threads, label).
README_ROWS = (
    ("envd in-process", "auto", "envd in-process (`envd.make`)"),
    ("envd fast path", "auto", "envd through the daemon, fast path (default on the same host)"),
    ("envd daemon socket", "auto", "envd through the daemon, socket path (`fast_path=False`)"),
    ("EnvPool sync", "auto", "EnvPool sync, in-process"),
    ("EnvPool async", "auto", "EnvPool async (batch N/2)"),
    ("gymnasium numpy vector", "-", "gymnasium numpy vector env"),
    ("gymnasium AsyncVectorEnv", "-", "gymnasium AsyncVectorEnv"),
)


def _cell(row: dict[str, Any], n: int) -> str:
    values = row.get("rounds", {}).get(n) or row.get("rounds", {}).get(str(n))
    if values:
        return spread_text(values)
    cell = row["cells"].get(n, row["cells"].get(str(n)))
    return "n/a" if isinstance(cell, str) and cell.startswith("n/a") else "-"


def machine_line(r: dict[str, Any]) -> str:
    m, s = r["machine"], r["settings"]
    load = m.get("load") or {}
    quiet = ("a loaded machine (see the report's warning): rerun before trusting a ratio"
             if load.get("reasons") else "quiet while it ran")
    return (f"Measured with `envd bench` on {m['time'][:10]}: {m['cpu']}, "
            f"{m['usable_cpus']} usable CPUs, load average {m['load_average'][0]:.2f}, "
            f"{quiet}; each figure is the median of {s['rounds']} interleaved rounds of "
            f"{s['seconds']:g} s, ± half their min-max range.")


def steps_table(r: dict[str, Any]) -> list[str]:
    """CartPole-v1 env steps/s per system (threads auto) and N."""
    sizes = r["sizes"]
    rows = {(row["system"], row["threads"]): row for row in r["table"]}
    lines = ["| system | " + " | ".join(f"N={n}" for n in sizes) + " |",
             "|---" * (1 + len(sizes)) + "|"]
    for system, threads, label in README_ROWS:
        row = rows.get((system, threads))
        if row is not None:
            lines.append(f"| {label} | " + " | ".join(_cell(row, n) for n in sizes) + " |")
    return lines


def latency_line(r: dict[str, Any]) -> str:
    parts = []
    for name, value in r["latency_us"].items():
        if isinstance(value, dict):
            parts.append(f"{name} p50 {value['p50']:.1f} us (p99 {value['p99']:.0f} us)")
    return "One step at N=1: " + ("; ".join(parts) if parts else "not measured") + "."


def learner_table(r: dict[str, Any]) -> list[str]:
    """async/sync ratios with a learner as long as one sync step, per env and system."""
    learner = r.get("learner") or {}
    if not learner:
        return []
    first = next(iter(learner.values()))
    lines = [f"Async against sync with a learner (N={first['num_envs']}, batch "
             f"{first['batch_size']}; sleep: a GPU-bound learner, busy: a CPU-bound one): "
             "async/sync env steps per second",
             "",
             "| env | learner | " + " | ".join(bench_learner.SYSTEMS) + " |",
             "|---|---" + "|---" * len(bench_learner.SYSTEMS) + "|"]
    for env_id, entry in learner.items():
        for kind in bench_learner.LEARNERS:
            cells = []
            for system in bench_learner.SYSTEMS:
                ratios = bench_learner.async_ratios(entry, system, kind)
                cells.append(ratio_text(ratios) if ratios else "n/a")
            lines.append(f"| {env_id} | {kind} | " + " | ".join(cells) + " |")
    return lines


def readme_text(r: dict[str, Any]) -> str:
    """The whole readme_table.md."""
    lines = [machine_line(r), "", *steps_table(r), "", latency_line(r)]
    learner = learner_table(r)
    if learner:
        lines += ["", *learner]
    lines += ["", "Targets:", ""]
    lines += [f"- {t['status']}: {t['target']} ({t['detail']})" for t in r["targets"]]
    return "\n".join(lines) + "\n"


__all__ = ["README_ROWS", "readme_text"]
