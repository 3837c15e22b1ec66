"""The names of a pod's journal shards, and finding the ones that exist."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.ledger.shards import adopted, journal_of, numbered, shard_path, shards


@pytest.mark.parametrize(
    ("journal", "k", "expected"),
    [
        ("/data/usage.sqlite", 0, "/data/usage.sqlite"),
        ("/data/usage.sqlite", 1, "/data/usage.worker-1.sqlite"),
        ("/data/usage.sqlite", 12, "/data/usage.worker-12.sqlite"),
        ("/data/usage", 3, "/data/usage.worker-3"),
        ("/data/usage.v2.sqlite", 2, "/data/usage.v2.worker-2.sqlite"),
    ],
)
def test_worker_zero_keeps_the_journal_and_the_others_sit_beside_it(
    journal: str, k: int, expected: str
) -> None:
    """Worker 0 writes ``--journal`` itself (one worker is today's file); worker k its
    ``<stem>.worker-<k><suffix>`` in the same directory."""
    assert shard_path(Path(journal), k) == Path(expected)


@pytest.mark.parametrize(
    "journal", ["/data/usage.sqlite", "/data/usage", "/data/usage.v2.sqlite", "/d/a.worker-1.db"]
)
@pytest.mark.parametrize("k", [0, 1, 12])
def test_a_shard_names_its_pods_journal(journal: str, k: int) -> None:
    """``journal_of`` undoes ``shard_path``: a worker, given its shard, finds the pod's
    journal (whose every shard its usage API reads)."""
    assert journal_of(shard_path(Path(journal), k), k) == Path(journal)


def test_a_file_that_is_not_the_workers_shard_names_no_journal() -> None:
    """Worker 2's shard is never worker 1's: no journal is guessed."""
    with pytest.raises(ValueError, match="worker 1"):
        journal_of(Path("/data/usage.worker-2.sqlite"), 1)


def test_shards_are_numbered_by_worker(tmp_path: Path) -> None:
    """``numbered`` pairs each existing shard with its worker's index."""
    journal = tmp_path / "j.sqlite"
    for k in (0, 2, 10):
        shard_path(journal, k).touch()
    assert numbered(journal) == [(k, shard_path(journal, k)) for k in (0, 2, 10)]


def test_a_negative_index_is_refused() -> None:
    """There is no worker -1: a bad index is a bug, said, not a strange file name."""
    with pytest.raises(ValueError, match="-1"):
        shard_path(Path("/data/usage.sqlite"), -1)


def test_shards_are_found_in_worker_order(tmp_path: Path) -> None:
    """Every shard that exists, worker 0 first and then by index (10 after 2, not
    before), and nothing else of the directory: SQLite's ``-wal``/``-shm`` files, another
    journal's shards, names that only look alike."""
    journal = tmp_path / "usage.sqlite"
    for k in (0, 10, 2, 1):
        shard_path(journal, k).write_text("")
    for name in (
        "usage.sqlite-wal",
        "usage.worker-1.sqlite-wal",
        "usage.worker-1.sqlite-shm",
        "other.worker-1.sqlite",
        "usage.worker-0.sqlite",
        "usage.worker-01.sqlite",
        "usage.worker-x.sqlite",
        "usage.worker-3.db",
    ):
        (tmp_path / name).write_text("")
    (tmp_path / "usage.worker-4.sqlite").mkdir()
    assert shards(journal) == [shard_path(journal, k) for k in (0, 1, 2, 10)]


def test_without_files_there_are_no_shards(tmp_path: Path) -> None:
    """No journal yet (or no directory): none, not the path that does not exist; a pod
    whose worker 0 has not written yet still has its other shards found."""
    journal = tmp_path / "usage.sqlite"
    assert shards(journal) == []
    assert shards(tmp_path / "missing" / "usage.sqlite") == []
    shard_path(journal, 1).write_text("")
    assert shards(journal) == [shard_path(journal, 1)]


@pytest.mark.parametrize(
    ("workers", "index", "delivers"),
    [
        (2, 0, [2, 4]),  # 2 mod 2 and 4 mod 2
        (2, 1, [3]),
        (3, 0, [3]),
        (3, 1, [4]),
        (3, 2, []),
        (5, 0, []),  # every shard has its own worker
    ],
)
def test_a_smaller_pod_adopts_the_shards_of_the_workers_it_lost(
    tmp_path: Path, workers: int, index: int, delivers: list[int]
) -> None:
    """Shards 0-4 on disk: each index the pod no longer has goes to worker k mod N, and a
    worker's own shard is never adopted."""
    journal = tmp_path / "usage.sqlite"
    for k in range(5):
        shard_path(journal, k).write_bytes(b"")
    found = adopted(journal, index, workers)
    assert found == [shard_path(journal, k) for k in delivers]
