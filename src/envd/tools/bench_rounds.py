"""Rounds, spread and verdicts of ``envd bench`` (pure functions, no envd).

A benchmark on a shared machine is only as honest as its method:

- **Interleaved rounds.** Every system being compared is measured once per
  round (round 1: A, B, C; round 2: A, B, C; ...), never all rounds of A and
  then all of B, so that a burst of load from elsewhere lands on every system
  instead of on whichever one happened to be running.  The order inside a
  round is shuffled (no system always runs first, right after a warm-up).
- **Spread.** Each configuration keeps every round's value; the report gives
  the median and ``±``, half the min-max range over rounds, relative to the
  median.  A ratio of two systems is taken round by round (the two values of
  one round were measured seconds apart, under the same load), and its spread
  is that of the per-round ratios.
- **Not judged.** A target line compares a measured value with its limit.
  When half the min-max range of the value is wider than the margin between
  the value and its limit, the rounds disagree about which side of the limit
  it is on: the line says ``NOT JUDGED`` instead of PASS or FAIL.
"""
from __future__ import annotations

import dataclasses
import random
import statistics
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

K = TypeVar("K", bound=Hashable)

#: Verdicts of a target line.
PASS, FAIL, NOT_JUDGED, NOT_AVAILABLE = "PASS", "FAIL", "NOT JUDGED", "N/A"


def interleaved_rounds(keys: Sequence[K], rounds: int, measure: Callable[[K, int], float],
                       shuffle: Callable[[list[K]], None] | None = random.shuffle,
                       ) -> dict[K, list[float]]:
    """Measure every key once per round, for `rounds` rounds: measure(key,
    round_index) -> a value.  Returns each key's values in round order.  The
    keys' order inside a round is `shuffle`d in place (None: always as given);
    round r + 1 starts only when every key has had its round r."""
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    values: dict[K, list[float]] = {key: [] for key in keys}
    order = list(keys)
    for round_index in range(rounds):
        if shuffle is not None:
            shuffle(order)
        for key in order:
            values[key].append(measure(key, round_index))
    return values


@dataclasses.dataclass(frozen=True)
class Spread:
    """A value measured over rounds: its median, extremes and quartiles."""

    median: float
    low: float        # the smallest round
    high: float       # the largest round
    q1: float
    q3: float
    rounds: int

    @property
    def half_range(self) -> float:
        """Half the min-max range: the ``±`` of the report."""
        return (self.high - self.low) / 2

    @property
    def relative(self) -> float:
        """half_range / median (0 where the median is 0)."""
        return self.half_range / self.median if self.median else 0.0

    def as_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


def spread(values: Sequence[float]) -> Spread:
    """The spread of one configuration's rounds (at least one value)."""
    if not values:
        raise ValueError("no rounds to summarise")
    ordered = sorted(values)
    if len(ordered) == 1:
        q1 = q3 = ordered[0]
    else:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    return Spread(median=statistics.median(ordered), low=ordered[0], high=ordered[-1],
                  q1=q1, q3=q3, rounds=len(ordered))


def paired_ratios(numerator: Sequence[float], denominator: Sequence[float]) -> list[float]:
    """numerator[i] / denominator[i] round by round (rounds with a zero
    denominator left out): two values of one round were measured under the
    same load, which a ratio of two medians would forget."""
    if len(numerator) != len(denominator):
        raise ValueError(f"{len(numerator)} rounds against {len(denominator)}: not paired")
    return [a / b for a, b in zip(numerator, denominator) if b]


def judge(values: Sequence[float] | None, op: str, limit: float) -> dict[str, Any]:
    """The verdict of a target `value op limit` (op ">=" or "<=") over the
    rounds' values: {status, value (the median), spread (half the min-max
    range), margin (|median - limit|)}.  N/A without values; NOT JUDGED when
    the spread is wider than the margin; else PASS or FAIL."""
    if op not in (">=", "<="):
        raise ValueError(f"op must be '>=' or '<=', not {op!r}")
    if not values:
        return {"status": NOT_AVAILABLE, "value": None, "spread": None, "margin": None}
    s = spread(values)
    margin = abs(s.median - limit)
    met = s.median >= limit if op == ">=" else s.median <= limit
    if s.half_range > margin:
        status = NOT_JUDGED
    else:
        status = PASS if met else FAIL
    return {"status": status, "value": s.median, "spread": s.half_range, "margin": margin}


def rate_text(x: float | None) -> str:
    """1234567.0 -> '1.23M'."""
    if x is None:
        return "n/a"
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= size:
            return f"{x / size:.3g}{unit}"
    return f"{x:.3g}"


def spread_text(values: Sequence[float], unit: Callable[[float], str] = rate_text) -> str:
    """'24.1M ±3%': the median of the rounds and half their min-max range,
    relative to the median."""
    s = spread(values)
    return f"{unit(s.median)} ±{100 * s.relative:.0f}%"


def ratio_text(values: Sequence[float]) -> str:
    """'1.23x ±0.05': the median of per-round ratios and half their range."""
    s = spread(values)
    return f"{s.median:.2f}x ±{s.half_range:.2f}"
