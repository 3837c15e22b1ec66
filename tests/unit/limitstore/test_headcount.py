"""The replica count kept beside the journal: read back as written, nothing from a file
that is missing or holds no count, and a failure to keep it logged, never raised."""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from proxy.limitstore.headcount import CountFile


def test_a_count_written_is_read_back(tmp_path: Path) -> None:
    """A count kept is the count a new process reads; the file is replaced whole."""
    CountFile(tmp_path / "limits-replicas").write(3)
    assert CountFile(tmp_path / "limits-replicas").read() == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["limits-replicas"]


@pytest.mark.parametrize("text", [None, "", "three\n", "-2\n"])
def test_no_count_is_read_from_a_file_without_one(tmp_path: Path, text: str | None) -> None:
    """A missing file, an empty one, or one that holds no count: none known (0)."""
    path = tmp_path / "limits-replicas"
    if text is not None:
        path.write_text(text)
    assert CountFile(path).read() == 0


def test_a_count_that_cannot_be_kept_is_logged(tmp_path: Path) -> None:
    """A folder that is gone: the count is not kept, and the log says so."""
    kept = CountFile(tmp_path / "gone" / "limits-replicas")
    with capture_logs() as logs:
        kept.write(2)
    assert [e["event"] for e in logs] == ["limits_replicas_unkept"]
    assert kept.read() == 0


def test_the_workers_of_a_pod_keep_their_count_in_one_file_without_a_shared_spare(
    tmp_path: Path,
) -> None:
    """A pod's workers keep the count beside their shards, in one file: each writes its own
    spare (a spare shared by two writers could be renamed away under the other, whose
    count was then not kept), so another writer's spare in flight is left alone."""
    path = tmp_path / "limits-replicas"
    theirs = tmp_path / "limits-replicas.new"  # another worker's spare, mid-write
    theirs.write_text("3\n", encoding="ascii")
    CountFile(path).write(4)
    assert CountFile(path).read() == 4
    assert theirs.read_text(encoding="ascii") == "3\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["limits-replicas", theirs.name]
