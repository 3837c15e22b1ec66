"""The cores this process may use, for ``--workers auto`` (docs/workers.md, step 3): the
CPU affinity, capped by the cgroup's CPU quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` over
``cpu.cfs_period_us``) on this process's cgroup and every ancestor. A fraction of a core
still runs a worker (1.5 CPUs: 2). The parsing is pure; the reading is around it."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True, slots=True)
class Budget:
    """What ``auto`` was resolved from, logged beside the worker count."""

    affinity: int
    quota: int | None  # None: no cgroup quota found

    @property
    def workers(self) -> int:
        return max(1, min(self.affinity, self.quota or self.affinity))


def cpu_max(text: str) -> int | None:
    """cgroup v2 ``cpu.max`` (``"max 100000"`` or ``"200000 100000"``) as whole cores."""
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    return _cores(int(parts[0]), int(parts[1]))


def cfs_quota(quota_us: str, period_us: str) -> int | None:
    """cgroup v1 ``cpu.cfs_quota_us`` (-1 is no limit) over ``cpu.cfs_period_us``."""
    return _cores(int(quota_us), int(period_us))


def _cores(quota: int, period: int) -> int | None:
    if quota <= 0 or period <= 0:
        return None
    return math.ceil(quota / period)


def cgroup_paths(proc_cgroup: str) -> tuple[str | None, str | None]:
    """This process's v2 path and v1 ``cpu`` controller path from ``/proc/self/cgroup``
    (``0::/a/b``, ``4:cpu,cpuacct:/a/b``)."""
    v2 = v1 = None
    for line in proc_cgroup.splitlines():
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if number == "0" and controllers == "":
            v2 = path
        elif "cpu" in controllers.split(","):
            v1 = path
    return v2, v1


def ancestors(path: str) -> list[str]:
    """``/a/b`` and every cgroup above it, the root included: ``["/a/b", "/a", "/"]``."""
    found = [path]
    while path not in ("/", ""):
        path = path.rsplit("/", 1)[0] or "/"
        found.append(path)
    return found


def smallest(quotas: list[int | None]) -> int | None:
    """The tightest quota along the path (None where no level limits)."""
    limits = [q for q in quotas if q is not None]
    return min(limits) if limits else None


def cgroup_quota(root: Path = ROOT, proc: Path = Path("/proc/self/cgroup")) -> int | None:
    """The tightest CPU quota over this process's cgroup and its ancestors, v2 then v1."""
    try:
        v2, v1 = cgroup_paths(proc.read_text())
    except OSError:
        return None
    found: list[int | None] = []
    for path in ancestors(v2) if v2 is not None else []:
        found.append(_read_v2(root / path.lstrip("/") / "cpu.max"))
    for path in ancestors(v1) if v1 is not None else []:
        where = root / "cpu" / path.lstrip("/")
        found.append(_read_v1(where))
    return smallest(found)


def _read_v2(path: Path) -> int | None:
    try:
        return cpu_max(path.read_text())
    except OSError:
        return None


def _read_v1(where: Path) -> int | None:
    try:
        quota = (where / "cpu.cfs_quota_us").read_text()
        period = (where / "cpu.cfs_period_us").read_text()
    except OSError:
        return None
    return cfs_quota(quota, period)


def budget() -> Budget:
    """The cores this process may use now."""
    return Budget(affinity=len(os.sched_getaffinity(0)), quota=cgroup_quota())
