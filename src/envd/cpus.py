"""The CPUs this process may actually use: its affinity, bounded by a cgroup
CPU quota (a container's ``--cpus``, a Kubernetes CPU limit), which the
affinity does not show.  Hosted envs size their default worker count and
decide whether to spin on it (native/hosted_env.py, native/hosted_worker.py).
"""
from __future__ import annotations

import math
import os
from pathlib import Path


def _quota(text: str) -> float | None:
    """CPUs of a cgroup v2 cpu.max ("max 100000", "150000 100000"); None: no quota."""
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def cgroup_cpu_limit(root: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup"
                     ) -> float | None:
    """The tightest CPU quota on this process's cgroup and its ancestors, in
    CPUs (cgroup v2 cpu.max, or v1 cpu.cfs_quota_us / cpu.cfs_period_us at
    the cpu controller's path); None when there is none or it cannot be read."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    limits: list[float] = []
    for line in lines:
        _, controllers, path = line.split(":", 2) if line.count(":") >= 2 else ("", "", "")
        if controllers == "":  # v2: cpu.max along the path
            candidates = [(Path(root, path.lstrip("/")), "v2")]
        elif "cpu" in controllers.split(","):
            candidates = [(Path(root, controllers, path.lstrip("/")), "v1"),
                          (Path(root, "cpu", path.lstrip("/")), "v1")]
        else:
            continue
        for folder, version in candidates:
            for directory in (folder, *folder.parents):
                if not str(directory).startswith(root):
                    break
                limit = _read_limit(directory, version)
                if limit is not None:
                    limits.append(limit)
    return min(limits) if limits else None


def _read_limit(directory: Path, version: str) -> float | None:
    try:
        if version == "v2":
            return _quota((directory / "cpu.max").read_text())
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def usable_cpus() -> int:
    """CPUs this process can run on at once: its affinity's count, at most
    the cgroup quota rounded up (1.5 CPUs of quota: 2 may run), at least 1."""
    cpus = len(os.sched_getaffinity(0))
    limit = cgroup_cpu_limit()
    if limit is not None:
        cpus = min(cpus, math.ceil(limit))
    return max(1, cpus)
