"""A journal file read offline: its records by kind and time, its dead letters."""

from __future__ import annotations

from pathlib import Path

from proxy.ledger.journal import Journal
from proxy.ledger.journal_files import list_dead_letters, read_journal, requeue_dead_letters
from proxy.ledger.records import UsageRecord
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
