"""Was the machine loaded while ``envd bench`` ran?  (Linux /proc accounting.)

Two samples, one before the run and one after, each of:

- the CPU time the usable CPUs (this process's affinity) spent busy, summed
  over every process (``/proc/stat``: user, nice, system, irq, softirq), and
  the time the hypervisor stole from them (steal);
- the CPU time of this process and all its descendants, live or reaped
  (``/proc/<pid>/stat``: utime + stime + cutime + cstime): the benchmark's
  own daemons, client processes and peers;
- the 1-minute load average.

Busy time that is not the benchmark's own is other processes' work on the
CPUs the benchmark measured with.  As a fraction of the CPU time available
(wall time x usable CPUs) it says how much of the machine was taken away; the
run is flagged when that or the stolen time passes a threshold, or when the
load average before the run already said the machine was busy.  The numbers
are the same for every system measured (interleaved rounds share the load),
but ratios near a target and absolute figures deserve a rerun.
"""
from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterable

#: Other processes' busy CPU time above this fraction of the run's CPU time: loaded.
OTHER_FRACTION_LIMIT = 0.10
#: Stolen CPU time above this fraction of the run's CPU time: loaded.
STEAL_FRACTION_LIMIT = 0.05
#: A load average before the run above this fraction of the usable CPUs: loaded.
LOAD_AVERAGE_LIMIT = 0.5


@dataclasses.dataclass(frozen=True)
class CpuSample:
    """One reading of the machine (CPU times in seconds)."""

    wall: float       # time.monotonic()
    busy: float       # all processes' busy time on the usable CPUs
    steal: float      # time stolen from the usable CPUs
    own: float        # this process and its descendants
    load_average: float  # 1 minute


@dataclasses.dataclass(frozen=True)
class LoadReport:
    """What two samples say about the run between them."""

    cpus: int
    seconds: float
    other_fraction: float   # other processes' busy time / (seconds x cpus)
    steal_fraction: float   # stolen time / (seconds x cpus)
    load_before: float
    load_after: float
    reasons: tuple[str, ...]  # why the run counts as loaded; empty when it does not

    @property
    def loaded(self) -> bool:
        return bool(self.reasons)

    def warning(self) -> str | None:
        """The line the report prints, or None on a quiet machine."""
        return warning_text(self.reasons) if self.reasons else None

    def as_dict(self) -> dict[str, object]:
        return {**dataclasses.asdict(self), "reasons": list(self.reasons),
                "loaded": self.loaded}


def warning_text(reasons: Iterable[str]) -> str:
    """The warning line for a loaded run."""
    return ("WARNING: the machine was loaded while the benchmark ran ("
            + "; ".join(reasons) + "): rerun before reading much into the figures")


def assess(before: CpuSample, after: CpuSample, cpus: int,
           other_limit: float = OTHER_FRACTION_LIMIT, steal_limit: float = STEAL_FRACTION_LIMIT,
           load_limit: float = LOAD_AVERAGE_LIMIT) -> LoadReport:
    """Compare two samples taken around a run on `cpus` usable CPUs."""
    seconds = max(after.wall - before.wall, 1e-9)
    capacity = seconds * max(cpus, 1)
    # Busy time not ours; never negative (the two counters tick at different moments).
    other = max(0.0, (after.busy - before.busy) - (after.own - before.own))
    steal = max(0.0, after.steal - before.steal)
    other_fraction, steal_fraction = other / capacity, steal / capacity
    reasons = []
    if other_fraction > other_limit:
        reasons.append(f"other processes used {100 * other_fraction:.0f}% of the "
                       f"{cpus} usable CPU(s)")
    if steal_fraction > steal_limit:
        reasons.append(f"the hypervisor stole {100 * steal_fraction:.0f}% of their time")
    if before.load_average > load_limit * cpus:
        reasons.append(f"load average {before.load_average:.2f} before the run "
                       f"on {cpus} CPU(s)")
    return LoadReport(cpus=cpus, seconds=seconds, other_fraction=other_fraction,
                      steal_fraction=steal_fraction, load_before=before.load_average,
                      load_after=after.load_average, reasons=tuple(reasons))


def parse_proc_stat(text: str, cpus: Iterable[int], ticks: float) -> tuple[float, float]:
    """(busy, steal) seconds of the given CPUs from /proc/stat's text."""
    wanted = {f"cpu{c}" for c in cpus}
    busy = steal = 0
    for line in text.splitlines():
        fields = line.split()
        if not fields or fields[0] not in wanted:
            continue
        # user nice system idle iowait irq softirq steal [guest guest_nice]
        # (guest time is already inside user and nice)
        values = [int(x) for x in fields[1:9]] + [0] * max(0, 9 - len(fields))
        busy += values[0] + values[1] + values[2] + values[5] + values[6]
        steal += values[7]
    return busy / ticks, steal / ticks


def parse_pid_stat(text: str) -> tuple[int, int]:
    """(parent pid, utime + stime + cutime + cstime in ticks) of a /proc/<pid>/stat."""
    rest = text[text.rindex(")") + 2:].split()  # the command name may hold spaces and ')'
    ppid = int(rest[1])
    return ppid, sum(int(x) for x in rest[11:15])


def tree_ticks(root: int, stats: dict[int, str]) -> int:
    """CPU ticks of `root` and all its descendants among `stats` ({pid:
    /proc/<pid>/stat text}), reaped children included (cutime/cstime)."""
    parsed = {}
    for pid, text in stats.items():
        try:
            parsed[pid] = parse_pid_stat(text)
        except (ValueError, IndexError):
            continue
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in parsed.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        if pid in parsed:
            total += parsed[pid][1]
        todo.extend(children.get(pid, ()))
    return total


def _read_all_pid_stats() -> dict[int, str]:
    stats = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    stats[int(name)] = f.read()
            except OSError:  # gone meanwhile
                continue
    return stats


def sample() -> CpuSample | None:
    """A reading now; None where /proc is not Linux's."""
    try:
        ticks = float(os.sysconf("SC_CLK_TCK"))
        with open("/proc/stat") as f:
            busy, steal = parse_proc_stat(f.read(), os.sched_getaffinity(0), ticks)
        own = tree_ticks(os.getpid(), _read_all_pid_stats()) / ticks
        load = os.getloadavg()[0]
    except (OSError, ValueError, AttributeError):
        return None
    return CpuSample(wall=time.monotonic(), busy=busy, steal=steal, own=own, load_average=load)
