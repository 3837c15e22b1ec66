"""``--workers auto``: the cgroup files' text and the affinity to a number of workers."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.serving.cpus import (
    Budget,
    ancestors,
    cfs_quota,
    cgroup_paths,
    cgroup_quota,
    cpu_max,
    smallest,
)


@pytest.mark.parametrize(
    ("text", "cores"),
    [
        ("max 100000\n", None),
        ("200000 100000\n", 2),
        ("150000 100000", 2),  # a fraction of a core still runs a worker
        ("50000 100000", 1),
        ("100000 100000", 1),
        ("", None),
    ],
)
def test_cgroup_v2_cpu_max(text: str, cores: int | None) -> None:
    """cpu.max: "max" is no limit; a quota over its period, rounded up."""
    assert cpu_max(text) == cores


@pytest.mark.parametrize(
    ("quota", "period", "cores"),
    [("-1\n", "100000\n", None), ("400000", "100000", 4), ("250000", "100000", 3)],
)
def test_cgroup_v1_cfs_quota(quota: str, period: str, cores: int | None) -> None:
    """cpu.cfs_quota_us: -1 is no limit; else the quota over the period, rounded up."""
    assert cfs_quota(quota, period) == cores


@pytest.mark.parametrize(
    ("proc", "v2", "v1"),
    [
        ("0::/kubepods/pod1/c1\n", "/kubepods/pod1/c1", None),
        ("4:memory:/m\n2:cpu,cpuacct:/k/p\n0::/\n", "/", "/k/p"),  # a v1 hybrid
        ("1:cpu:/\n0::/\n", "/", "/"),  # this development machine
        ("3:cpuset:/s\n", None, None),
    ],
)
def test_the_cgroup_of_this_process(proc: str, v2: str | None, v1: str | None) -> None:
    """/proc/self/cgroup's v2 line and the v1 line of the cpu controller."""
    assert cgroup_paths(proc) == (v2, v1)


def test_every_ancestor_is_read() -> None:
    """A quota on a parent (the pod) caps the container below it."""
    assert ancestors("/a/b") == ["/a/b", "/a", "/"]
    assert ancestors("/") == ["/"]
    assert smallest([None, 4, 2, None]) == 2
    assert smallest([None, None]) is None


@pytest.mark.parametrize(
    ("affinity", "quota", "workers"),
    [(16, None, 16), (16, 2, 2), (2, 8, 2), (1, None, 1), (4, 3, 3)],
)
def test_workers_are_the_smaller_of_affinity_and_quota(
    affinity: int, quota: int | None, workers: int
) -> None:
    """A pod limited to 2 CPUs on a 16-core node gets 2; no quota, every usable core."""
    assert Budget(affinity, quota).workers == workers


def test_a_quota_on_the_parent_of_a_v2_cgroup(tmp_path: Path) -> None:
    """The files as a pod's container sees them: no limit on its own cgroup, 2 CPUs on
    its pod's."""
    (tmp_path / "pod" / "c").mkdir(parents=True)
    (tmp_path / "pod" / "c" / "cpu.max").write_text("max 100000\n")
    (tmp_path / "pod" / "cpu.max").write_text("200000 100000\n")
    proc = tmp_path / "cgroup"
    proc.write_text("0::/pod/c\n")
    assert cgroup_quota(tmp_path, proc) == 2


def test_a_v1_quota(tmp_path: Path) -> None:
    """cgroup v1's cpu controller, read below /sys/fs/cgroup/cpu."""
    where = tmp_path / "cpu" / "k"
    where.mkdir(parents=True)
    (where / "cpu.cfs_quota_us").write_text("300000\n")
    (where / "cpu.cfs_period_us").write_text("100000\n")
    proc = tmp_path / "cgroup"
    proc.write_text("2:cpu,cpuacct:/k\n0::/\n")
    assert cgroup_quota(tmp_path, proc) == 3


def test_no_cgroup_files_is_no_quota(tmp_path: Path) -> None:
    """Outside any cgroup file system (or unreadable): no quota, the affinity decides."""
    assert cgroup_quota(tmp_path, tmp_path / "missing") is None
