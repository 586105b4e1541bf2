"""The async-over-several-daemons comparison of ``envd bench`` (issue 20).

On one host, with the same threads in all: async mode of N envs (batch
B = N/2, EnvPool's loop: ``recv`` B envs, ``send`` their actions straight
back) on one daemon of T threads, against ``envd.connect([a, b])`` over two
daemons of T/2 threads each (N/2 envs on each; client/multi_async.py).  Env
steps per second for CartPole-v1 (cheap steps: the per-batch messages
dominate) and Acrobot-v1 (costlier steps), the systems measured once per
round, rounds interleaved (bench_rounds.interleaved_rounds); the ratio is
taken round by round.  Target (issue 20): two daemons >= 0.9x one daemon (on
its default path: the fast path where offered).  The one daemon's socket path
is measured too, without a target: the shards of two daemons step over the
socket (client/multi_async.py), so it tells the cost of the path apart from
the cost of spreading.
N and the time per measurement are the learner comparison's (``envd bench
--learner-envs``, default 4096; bench_learner.py).
"""
from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from envd.tools.bench_rounds import interleaved_rounds, judge, paired_ratios, ratio_text, spread, spread_text

MULTI_ENVS = ("CartPole-v1", "Acrobot-v1")
SYSTEMS = ("one daemon", "one daemon socket", "two daemons")
#: two daemons / one daemon, same total threads (issue 20)
TARGET = 0.9


def _actions(space: Any, n: int) -> np.ndarray:
    """n random actions of one env's space (Discrete or Box)."""
    rng = np.random.default_rng(0)
    if hasattr(space, "n"):
        return (space.start + rng.integers(0, space.n, n)).astype(space.dtype)
    return rng.uniform(space.low, space.high, (n, *space.shape)).astype(space.dtype)


class AsyncLoop:
    """envd's async loop on an env it owns (made with batch_size B < N):
    recv B envs, send their actions straight back."""

    def __init__(self, env: Any):
        self.env = env
        self.batch = env.batch_size
        self.actions = _actions(env.single_action_space, self.batch)

    def rate(self, seconds: float) -> float:
        """Env steps per second over about `seconds` (every env out again
        before it returns: nothing steps in the background of the next
        measurement)."""
        env, actions = self.env, self.actions
        env.async_reset()
        steps, start = 0, time.perf_counter()
        deadline = start + seconds
        while True:
            for _ in range(4):
                env.send(actions, env.recv()[4]["env_id"])
            steps += 4 * self.batch
            now = time.perf_counter()
            if now >= deadline:
                break
        for _ in range(env.num_envs // self.batch):  # what is still out
            env.recv()
        return steps / (now - start)

    def close(self) -> None:
        self.env.close()


def measure(one: Any, two: Any, num_envs: int, rounds: int, seconds: float,
            env_ids: tuple[str, ...] = MULTI_ENVS,
            on_measure: Callable[[str], None] | None = None) -> dict[str, dict[str, Any]]:
    """Per env: the rounds of each system (``one``: a Client of the daemon of
    T threads, on its default path and on the socket; ``two``: a MultiClient
    of the two daemons of T/2), N envs, batch N/2: {num_envs, batch_size,
    rounds: {system: [steps/s per round]}, paths: {system: how its envs step}}."""
    batch = max(1, num_envs // 2)
    results = {}
    for env_id in env_ids:
        runs: dict[str, AsyncLoop] = {}
        try:
            for system, client, options in (("one daemon", one, {}),
                                            ("one daemon socket", one, {"fast_path": False}),
                                            ("two daemons", two, {})):
                runs[system] = AsyncLoop(client.make(env_id, num_envs, seed=0,
                                                     batch_size=batch, **options))

            def one_round(system: str, round_index: int, env_id: str = env_id) -> float:
                if on_measure is not None:
                    on_measure(f"{env_id} {system} (round {round_index + 1}/{rounds})")
                gc.disable()
                try:
                    return runs[system].rate(seconds)  # noqa: B023 -- called within this iteration
                finally:
                    gc.enable()

            by_system = interleaved_rounds(list(SYSTEMS), rounds, one_round)
            paths = {system: _path_of(run.env) for system, run in runs.items()}
        finally:
            for run in runs.values():
                run.close()
        results[env_id] = {"num_envs": num_envs, "batch_size": batch, "rounds": by_system,
                           "paths": paths}
    return results


def _path_of(env: Any) -> str:
    """How an env's envs step: one daemon's fast path or socket, or the shards' paths."""
    shards = getattr(env, "shards", None)
    if shards:
        return " + ".join(sorted({_path_of(shard) for shard in shards}))
    taken = getattr(env, "fast_path", None)
    return "unknown" if taken is None else ("fast path" if taken else "socket path")


def ratios(entry: dict[str, Any]) -> list[float] | None:
    """Per-round two daemons / one daemon (None: not measured)."""
    by_system = entry.get("rounds", {})
    if not (by_system.get("one daemon") and by_system.get("two daemons")):
        return None
    return paired_ratios(by_system["two daemons"], by_system["one daemon"])


def targets(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One target line per env, judged over the rounds: {target, status,
    value, op, limit, detail}."""
    found = []
    for env_id, entry in results.items():
        values = ratios(entry)
        verdict = judge(values, ">=", TARGET)
        found.append({"target": f"{env_id} async, two daemons (T/2 each) >= {TARGET:g}x one "
                                f"daemon (T)",
                      "status": verdict["status"], "value": verdict["value"], "op": ">=",
                      "limit": TARGET,
                      "detail": ratio_text(values) if values else "not measured"})
    return found


def report_lines(results: dict[str, dict[str, Any]], threads: int, half: int) -> list[str]:
    """The printed section: per env, each system's env steps/s and the ratio."""
    lines = [f"\nasync over two daemons on this host: N envs, batch N/2, recv then send straight "
             f"back;\none daemon of {threads} threads (its default path, and its socket path) "
             f"vs two of {half} each (N/2 envs on each)",
             f"  {'env':<14}{'N':>6}{'one daemon':>14}{'one, socket':>14}{'two daemons':>14}"
             f"{'two/one':>16}"]
    for env_id, entry in results.items():
        values = ratios(entry)
        by_system = entry["rounds"]
        lines.append(f"  {env_id:<14}{entry['num_envs']:>6}"
                     f"{spread_text(by_system['one daemon']):>14}"
                     f"{spread_text(by_system['one daemon socket']):>14}"
                     f"{spread_text(by_system['two daemons']):>14}"
                     f"{ratio_text(values) if values else '-':>16}")
        paths = entry.get("paths") or {}
        if paths:
            lines.append(f"  {'':<14}  (one daemon: {paths.get('one daemon')}; two daemons: "
                         f"{paths.get('two daemons')})")
    return lines


def summary(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """JSON-ready medians and spreads next to the raw rounds."""
    return {env_id: {**entry, "summary": {
        **{system: spread(values).as_dict() for system, values in entry["rounds"].items()},
        "two_over_one": spread(ratios(entry) or [0.0]).as_dict()}}
        for env_id, entry in results.items()}
