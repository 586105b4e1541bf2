"""The per-session thread cap in ``envd bench`` (issue 20): a cheap session
next to a CPU-heavy one in one daemon.

Two client processes step at the same time through the benchmark's auto
daemon, one a cheap session (CartPole-v1, 4096 envs: about 0.1 ms of env work
per step), the other a CPU-heavy one (ConnectFour-v0, 256 envs: about 5 ms).
Two configurations:

- ``capped``: the cheap session made with ``max_threads=0`` (its steps run on
  the daemon thread serving it, with no pool wake-up), the heavy one uncapped;
- ``uncapped``: both uncapped (the default).

Each configuration has its own two processes and sessions, made before the
rounds.  The configurations are measured round by round, in a shuffled order
(bench_rounds.interleaved_rounds): in a round, both processes of one
configuration step over the same window and report their env steps; each
session's rate is its steps over the window, and the pair total is the sum of
the two rates.  The report gives each session's rate and the pair total per
configuration, and the ratios capped/uncapped taken round by round; the target
line asks the capped pair total to be at least the uncapped one.

The sessions and the cap are a Pair: ``envd bench --ocean`` measures its own
(a cheap Ocean env next to a CPU-deep one, bench_ocean.py) the same way.
"""
from __future__ import annotations

import dataclasses
import gc
import multiprocessing
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import envd
from envd.tools.bench_rounds import interleaved_rounds, judge, paired_ratios, ratio_text, spread, spread_text

#: (env id, num_envs) of the two sessions of a pair.
CHEAP = ("CartPole-v1", 4096)
HEAVY = ("ConnectFour-v0", 256)
SESSIONS = ("cheap", "heavy")
#: configuration -> the cheap session's max_threads (the heavy one is never capped).
CONFIGS = {"capped": 0, "uncapped": None}
#: batches of sampled actions a session cycles through (ConnectFour's are its own)
SAMPLED_BATCHES = 8


@dataclasses.dataclass(frozen=True)
class Pair:
    """The two sessions, (env id, num_envs) each, and the cheap one's
    max_threads in the capped configuration (CONFIGS' uncapped is None)."""

    cheap: tuple[str, int] = CHEAP
    heavy: tuple[str, int] = HEAVY
    cap: int | None = CONFIGS["capped"]

    def max_threads(self, config: str) -> int | None:
        """The cheap session's max_threads in config."""
        return self.cap if config == "capped" else CONFIGS[config]


DEFAULT = Pair()


def session_client(endpoint: str, env_id: str, n: int, max_threads: int | None,
                   conn: Any) -> None:
    """A client process: make n envs of env_id (max_threads as given), report
    ("ready", whether the fast path was taken) or ("error", why); then for
    each (start, end) from the parent step from start (a time.monotonic value)
    until end, at least once, and reply (env steps, end time); None from the
    parent ends it."""
    try:
        client = envd.connect(endpoint, timeout=30)
        env = client.make(env_id, n, seed=0, max_threads=max_threads)
        env.reset(seed=0)
        env.action_space.seed(0)
        # ConnectFour: env k plays column (k + t) % 7 at step t, so that columns
        # fill evenly and most moves are legal (an illegal one ends the game cheaply)
        cycle = ([(np.arange(n) + t) % 7 for t in range(7)] if env_id == HEAVY[0]
                 else [np.asarray(env.action_space.sample()) for _ in range(SAMPLED_BATCHES)])
    except Exception as exc:  # noqa: BLE001  (reported to the parent, which raises)
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", bool(getattr(env, "fast_path", False))))
    try:
        while (window := conn.recv()) is not None:
            start, end = window
            env.step(cycle[0])
            time.sleep(max(0.0, start - time.monotonic() - 0.002))
            while time.monotonic() < start:  # the last 2 ms spinning: start on time
                pass
            steps, t = 0, 0
            gc.disable()
            while True:  # at least one step: a process a loaded host woke after `end` counts
                env.step(cycle[t % len(cycle)])
                steps += n
                t += 1
                now = time.monotonic()
                if now >= end:
                    break
            gc.enable()
            conn.send((steps, now))
    except EOFError:
        pass
    finally:
        env.close()
        client.close()


class Workers:
    """The client processes of every configuration: config -> {session: (process, pipe)}."""

    def __init__(self, endpoint: str, pair: Pair = DEFAULT):
        context = multiprocessing.get_context("forkserver")
        self.members: dict[str, dict[str, tuple[Any, Any]]] = {}
        self.fast_path: dict[str, dict[str, bool]] = {}
        try:
            for config in CONFIGS:
                cap = pair.max_threads(config)
                self.members[config] = {}
                for session, (env_id, n) in zip(SESSIONS, (pair.cheap, pair.heavy)):
                    parent, child = context.Pipe()
                    proc = context.Process(
                        target=session_client, daemon=True,
                        args=(endpoint, env_id, n, cap if session == "cheap" else None, child))
                    proc.start()
                    child.close()
                    self.members[config][session] = (proc, parent)
            for config, sessions in self.members.items():
                for session, (_, conn) in sessions.items():
                    if not conn.poll(120):
                        raise RuntimeError("a capped-pair client process did not start")
                    kind, value = conn.recv()
                    if kind == "error":
                        raise RuntimeError(f"a capped-pair client process failed: {value}")
                    self.fast_path.setdefault(config, {})[session] = value
        except BaseException:
            self.close()
            raise

    def step_window(self, config: str, seconds: float) -> tuple[float, dict[str, float]]:
        """Both sessions of config step over one window of `seconds`: the
        window's start and each session's (env steps, end time)."""
        start = time.monotonic() + 0.05  # CLOCK_MONOTONIC: one clock for all processes
        members = self.members[config]
        for _, conn in members.values():
            conn.send((start, start + seconds))
        return start, {session: conn.recv() for session, (_, conn) in members.items()}

    def close(self) -> None:
        for sessions in self.members.values():
            for _, conn in sessions.values():
                try:
                    conn.send(None)
                except (OSError, ValueError):
                    pass
        for sessions in self.members.values():
            for proc, conn in sessions.values():
                proc.join(30)
                if proc.is_alive():
                    proc.kill()
                    proc.join()
                conn.close()
        self.members.clear()


def measure(workers: Any, rounds: int, seconds: float,
            on_measure: Callable[[str], None] | None = None,
            pair: Pair = DEFAULT) -> dict[str, Any]:
    """Every configuration once per round, interleaved: per configuration and
    session, the env steps/s of each round ("rounds"), and the pair totals
    ("totals"); workers is a Workers (or anything with its step_window and
    fast_path)."""
    rates: dict[str, dict[str, list[float]]] = {c: {s: [] for s in SESSIONS} for c in CONFIGS}

    def measure_one(config: str, round_index: int) -> float:
        if on_measure is not None:
            on_measure(f"{config} (round {round_index + 1}/{rounds})")
        start, replies = workers.step_window(config, seconds)
        total = 0.0
        for session, (steps, end) in replies.items():
            rate = steps / (end - start)
            rates[config][session].append(rate)
            total += rate
        return total

    totals = interleaved_rounds(list(CONFIGS), rounds, measure_one)
    return {"cheap": {"env_id": pair.cheap[0], "num_envs": pair.cheap[1]},
            "heavy": {"env_id": pair.heavy[0], "num_envs": pair.heavy[1]}, "cap": pair.cap,
            "rounds": rates, "totals": totals, "fast_path": workers.fast_path}


def run(endpoint: str, rounds: int, seconds: float,
        on_measure: Callable[[str], None] | None = None,
        pair: Pair = DEFAULT) -> dict[str, Any]:
    """Start the client processes on the daemon at endpoint, measure, stop them."""
    workers = Workers(endpoint, pair)
    try:
        return measure(workers, rounds, seconds, on_measure, pair)
    finally:
        workers.close()


def ratios(entry: dict[str, Any], session: str | None = None) -> list[float] | None:
    """Per-round capped/uncapped ratios of the pair totals (or of one session's rate)."""
    if not entry:
        return None
    if session is None:
        capped, uncapped = entry["totals"].get("capped"), entry["totals"].get("uncapped")
    else:
        capped = entry["rounds"].get("capped", {}).get(session)
        uncapped = entry["rounds"].get("uncapped", {}).get(session)
    return paired_ratios(capped, uncapped) if capped and uncapped else None


def targets(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The target line (issue 20: capping the cheap session improves the
    pair's total), judged over rounds; none when the pair was not measured."""
    if not entry:
        return []
    found = ratios(entry)
    verdict = judge(found, ">=", 1.0)
    cheap, heavy = entry["cheap"], entry["heavy"]
    return [{"target": f"{cheap['env_id']} x{cheap['num_envs']} capped at "
                       f"max_threads={entry.get('cap', CONFIGS['capped'])} next to "
                       f"{heavy['env_id']} x{heavy['num_envs']}: pair total >= 1.0x uncapped",
             "status": verdict["status"], "value": verdict["value"], "op": ">=", "limit": 1.0,
             "detail": (f"{spread_text(entry['totals']['capped'])} / "
                        f"{spread_text(entry['totals']['uncapped'])} = {ratio_text(found)}")
             if found else "not measured"}]


def report_lines(entry: dict[str, Any]) -> list[str]:
    """The printed section: each configuration's session rates and pair total,
    then the capped/uncapped ratios (medians ± half the min-max range of rounds)."""
    if not entry:
        return []
    cheap = f"{entry['cheap']['env_id']} x{entry['cheap']['num_envs']}"
    heavy = f"{entry['heavy']['env_id']} x{entry['heavy']['num_envs']}"
    paths = {c: ("fast path" if all(f.values()) else "socket path")
             for c, f in entry["fast_path"].items()}
    lines = [f"  {'cheap session':<26}{cheap:>24}{heavy:>24}{'pair total':>14}"]
    for config, cap in CONFIGS.items():
        if config == "capped":
            cap = entry.get("cap", cap)
        label = f"{config} (max_threads={cap})"
        rounds = entry["rounds"][config]
        lines.append(f"  {label:<26}{spread_text(rounds['cheap']):>24}"
                     f"{spread_text(rounds['heavy']):>24}"
                     f"{spread_text(entry['totals'][config]):>14}  ({paths.get(config, '?')})")
    cells = [ratios(entry, "cheap"), ratios(entry, "heavy"), ratios(entry)]
    lines.append(f"  {'capped / uncapped':<26}" + "".join(
        f"{ratio_text(r) if r else '-':>{w}}" for r, w in zip(cells, (24, 24, 14))))
    return lines


def summary(entry: dict[str, Any]) -> dict[str, Any]:
    """JSON-ready medians and spreads next to the raw rounds."""
    if not entry:
        return {}
    return {**entry, "summary": {
        "totals": {c: spread(v).as_dict() for c, v in entry["totals"].items()},
        "capped_over_uncapped": {name: spread(r).as_dict() for name, r in (
            ("pair total", ratios(entry)), ("cheap", ratios(entry, "cheap")),
            ("heavy", ratios(entry, "heavy"))) if r}}}
