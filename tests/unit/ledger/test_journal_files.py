"""A journal file read offline: its records by kind and time, its dead letters."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.ledger.journal import Journal
from proxy.ledger.journal_files import (
    discard_exporter,
    list_dead_letters,
    list_exporters,
    read_journal,
    requeue_dead_letters,
)
from proxy.ledger.records import UsageRecord
from proxy.ledger.shards import shard_path
from tests.support.records import make_record


async def _journal_of(path: Path, records: list[UsageRecord]) -> None:
    journal = Journal(path)
    await journal.open()
    for record in records:
        await journal.append(record)
    await journal.close()


async def test_records_are_read_in_the_order_they_were_appended(tmp_path: Path) -> None:
    """``read_journal`` gives the usage bodies in append order, as they were written."""
    records = [make_record(i) for i in range(5)]
    await _journal_of(tmp_path / "j.sqlite", records)
    bodies = read_journal(tmp_path / "j.sqlite")
    assert [UsageRecord.from_json(b) for b in bodies] == records
    assert read_journal(tmp_path / "j.sqlite", kind="reconciliation") == []


async def test_the_time_range_is_half_open(tmp_path: Path) -> None:
    """``since`` is included, ``until`` excluded: adjacent periods never count a record twice."""
    records = [make_record(i) for i in range(3)]
    await _journal_of(tmp_path / "j.sqlite", records)
    at = records[1].time.isoformat()
    before = read_journal(tmp_path / "j.sqlite", until=at)
    after = read_journal(tmp_path / "j.sqlite", since=at)
    assert len(before) + len(after) == 3
    assert UsageRecord.from_json(after[0]).record_id == records[1].record_id


async def test_a_journal_without_dead_letters_lists_and_requeues_none(tmp_path: Path) -> None:
    """No rejected record: nothing to list, nothing requeued."""
    await _journal_of(tmp_path / "j.sqlite", [make_record(0)])
    assert list_dead_letters(tmp_path / "j.sqlite") == []
    assert list_dead_letters(tmp_path / "j.sqlite", sink="jsonl:-") == []
    assert requeue_dead_letters(tmp_path / "j.sqlite") == 0


async def test_every_shard_is_read_once_and_by_time(tmp_path: Path) -> None:
    """A pod of three workers wrote three shards: the report reads every one of them,
    interleaved by time; a record found in two shards (a bug: ids are uuid7) counts once."""
    journal = tmp_path / "j.sqlite"
    records = [make_record(i) for i in range(9)]
    for k in range(3):
        await _journal_of(shard_path(journal, k), records[k::3])
    await _journal_of(tmp_path / "other.worker-1.sqlite", [make_record(99)])  # not a shard
    bodies = read_journal(journal)
    assert [UsageRecord.from_json(b) for b in bodies] == records
    await _journal_of(shard_path(journal, 2), [records[0]])  # the same record again
    assert [UsageRecord.from_json(b) for b in read_journal(journal)] == records
    assert read_journal(journal, kind="reconciliation") == []


async def test_a_missing_journal_is_still_said_to_be_missing(tmp_path: Path) -> None:
    """No shard at all: the offline commands say there is no journal at the path."""
    with pytest.raises(FileNotFoundError, match="no journal at"):
        read_journal(tmp_path / "j.sqlite")


async def test_exporters_and_dead_letters_of_every_shard(tmp_path: Path) -> None:
    """``usage-proxy exporters`` sums each exporter's backlog over the shards;
    ``dead-letters`` lists and requeues every shard's; discarding an exporter forgets it
    in every shard and says how many records it had not received in all."""
    journal = tmp_path / "j.sqlite"
    for k, count in ((0, 2), (1, 3)):
        j = Journal(shard_path(journal, k))
        await j.open()
        await j.register(["postgres"] + (["jsonl:x"] if k else []))
        records = [make_record(k * 10 + i) for i in range(count)]
        for record in records:
            await j.append(record)
        await j.dead_letter("postgres", records[0], f"rejected by {k}")
        await j.close()
    assert list_exporters(journal) == {"jsonl:x": 3, "postgres": 5}
    letters = list_dead_letters(journal)
    assert sorted(d.error for d in letters) == ["rejected by 0", "rejected by 1"]
    assert [d.error for d in list_dead_letters(journal, sink="jsonl:x")] == []
    assert requeue_dead_letters(journal, sink="postgres") == 2
    assert all(d.requeued for d in list_dead_letters(journal))
    assert discard_exporter(journal, "postgres") == 5
    assert list_exporters(journal) == {"jsonl:x": 3}
    assert discard_exporter(journal, "postgres") is None
