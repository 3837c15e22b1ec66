"""The SQLite journal: group commit, restart survival, cursors, dedup, failures."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from proxy.ledger.journal import Journal, JournalError
from proxy.ledger.journal_files import read_journal
from proxy.ledger.records import Units
from tests.support.records import make_record


async def test_concurrent_appends_share_commits(tmp_path: Path) -> None:
    """200 concurrent appends all commit, in fewer transactions than records."""
    journal = Journal(tmp_path / "j.sqlite")
    await journal.open()
    commits = 0
    original = journal._insert

    def counting(rows: list[tuple[str, str, str, str]]) -> None:
        nonlocal commits
        commits += 1
        original(rows)

    journal._insert = counting  # type: ignore[method-assign]
    await asyncio.gather(*(journal.append(make_record(i)) for i in range(200)))
    await journal.close()
    assert len(read_journal(tmp_path / "j.sqlite")) == 200
    assert commits < 200


async def test_survives_restart_and_keeps_cursors(tmp_path: Path) -> None:
    """Records and delivery cursors persist; a reopened journal resumes the outbox."""
    path = tmp_path / "j.sqlite"
    journal = Journal(path)
    await journal.open()
    records = [make_record(i) for i in range(10)]
    for r in records:
        await journal.append(r)
    batch = await journal.batch("sink", 4)
    await journal.ack("sink", batch[-1][0])
    await journal.close()
    again = Journal(path)
    await again.open()
    assert await again.backlog("sink") == 6
    rest = await again.batch("sink", 100)
    assert [r.record_id for _, r in rest] == [r.record_id for r in records[4:]]
    await again.append(records[0])  # same record id: ignored
    assert await again.backlog("sink") == 6
    await again.close()


async def test_async_durability_returns_before_commit(tmp_path: Path) -> None:
    """async mode does not wait; close() still commits everything queued."""
    journal = Journal(tmp_path / "j.sqlite", sync=False)
    await journal.open()
    for i in range(50):
        await journal.append(make_record(i))
    await journal.close()
    assert len(read_journal(tmp_path / "j.sqlite")) == 50


async def test_async_durability_commits_once_per_interval(tmp_path: Path) -> None:
    """Sequential async appends within one commit interval share one commit, and each is
    committed about one interval after it was appended, without waiting for close()."""
    path = tmp_path / "j.sqlite"
    journal = Journal(path, sync=False, commit_interval=0.2)
    await journal.open()
    commits = 0
    original = journal._insert

    def counting(rows: list[tuple[str, str, str, str, str]]) -> None:
        nonlocal commits
        commits += 1
        original(rows)

    journal._insert = counting  # type: ignore[method-assign]
    started = asyncio.get_running_loop().time()
    for i in range(20):  # one at a time, as sequential requests append
        await journal.append(make_record(i))
        await asyncio.sleep(0.001)
    assert read_journal(path) == []  # the interval has not passed yet
    while len(read_journal(path)) < 20:
        assert asyncio.get_running_loop().time() - started < 5
        await asyncio.sleep(0.02)
    assert commits <= 2  # one per interval; 20 without the interval
    await journal.append(make_record(20))
    await journal.close()  # commits what is queued, without waiting for a next interval
    assert len(read_journal(path)) == 21


async def test_write_failure_is_reported_not_raised_elsewhere(tmp_path: Path) -> None:
    """A failing disk surfaces as JournalError to the appender, and the journal goes on."""
    journal = Journal(tmp_path / "j.sqlite")
    await journal.open()

    def broken(rows: list[tuple[str, str, str, str]]) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    original = journal._insert
    journal._insert = broken  # type: ignore[method-assign]
    with pytest.raises(JournalError, match="disk is full"):
        await journal.append(make_record(1))
    journal._insert = original  # type: ignore[method-assign]
    await journal.append(make_record(2))
    await journal.close()
    assert journal.failed == 1
    assert len(read_journal(tmp_path / "j.sqlite")) == 1


async def test_append_after_close_fails(tmp_path: Path) -> None:
    """A closed journal refuses records instead of losing them silently."""
    journal = Journal(tmp_path / "j.sqlite")
    await journal.open()
    await journal.close()
    with pytest.raises(JournalError):
        await journal.append(make_record(1))


async def test_prune_only_what_every_sink_has(tmp_path: Path) -> None:
    """Retention deletes old records all sinks acknowledged, never undelivered ones."""
    from datetime import UTC, datetime, timedelta

    journal = Journal(tmp_path / "j.sqlite")
    await journal.open()
    old = datetime.now(UTC) - timedelta(days=10)
    for i in range(10):
        await journal.append(make_record(i).model_copy(update={"time": old}))
    assert await journal.prune(datetime.now(UTC).isoformat()) == 0  # no exporter yet
    await journal.register(["a", "b"])
    await journal.ack("a", 6)
    await journal.ack("b", 4)
    cutoff = (datetime.now(UTC) - timedelta(days=1)).isoformat()
    assert await journal.prune(cutoff) == 4
    assert await journal.prune(cutoff) == 0
    assert await journal.backlog("a") == 4
    assert await journal.backlog("b") == 6
    await journal.close()
    assert len(read_journal(tmp_path / "j.sqlite")) == 6


async def test_response_owners_survive_a_restart(tmp_path: Path) -> None:
    """Issue #44: the tenant that made a stored response is remembered durably, and the
    first claim stands (an id is never handed to a second tenant)."""
    path = tmp_path / "j.sqlite"
    journal = Journal(path)
    await journal.open()
    await journal.claim_response("resp_a", "alice")
    await journal.claim_response("resp_a", "bob")
    assert await journal.response_owner("resp_a") == "alice"
    assert await journal.response_owner("resp_b") is None
    await journal.close()
    again = Journal(path)
    await again.open()
    assert await again.response_owner("resp_a") == "alice"
    await again.close()


async def test_owner_lookups_are_bounded_by_a_frozen_disk(tmp_path: Path) -> None:
    """A claim or lookup waits at most ``commit_timeout`` for a thread that a frozen disk
    holds, and a closed journal answers at once: neither hangs the request."""
    journal = Journal(tmp_path / "j.sqlite", commit_timeout=0.2)
    await journal.open()
    journal._thread.post(lambda: time.sleep(1.0))  # the disk freezes
    with pytest.raises(JournalError, match="no answer within"):
        await journal.response_owner("resp_a")
    await journal.close()
    with pytest.raises(JournalError, match="not open"):
        await journal.claim_response("resp_a", "alice")


async def test_a_sync_append_waits_at_most_the_commit_timeout(tmp_path: Path) -> None:
    """A sync append whose commit a frozen disk holds gives up after ``commit_timeout``
    (JournalError, journal unhealthy) without losing the record: it is committed once the
    disk comes back, and the next append answers normally."""
    journal = Journal(tmp_path / "j.sqlite", commit_timeout=0.2)
    await journal.open()
    journal._thread.post(lambda: time.sleep(0.6))  # the disk freezes
    started = time.monotonic()
    with pytest.raises(JournalError, match=r"commit took longer than 0\.2 s"):
        await journal.append(make_record(1))
    assert time.monotonic() - started < 0.5
    assert not journal.healthy
    await asyncio.sleep(0.5)  # the disk comes back
    await journal.append(make_record(2))
    await journal.close()
    assert len(read_journal(tmp_path / "j.sqlite")) == 2


async def test_health_changes_are_told_once_each(tmp_path: Path) -> None:
    """``on_health`` hears each change of the journal's health, on the event loop: False
    when a commit overruns its bound, True when the next commit succeeds, and nothing for
    the commits in between (the serving side sets the ``journal_ready`` gauge from it, a
    value a pod's metrics directory can hold where a scrape-time callback reads 0)."""
    told: list[bool] = []
    journal = Journal(tmp_path / "j.sqlite", commit_timeout=0.2, on_health=told.append)
    await journal.open()
    await journal.append(make_record(0))
    assert told == []  # healthy from the start: nothing changed
    journal._thread.post(lambda: time.sleep(0.6))  # the disk freezes
    with pytest.raises(JournalError):
        await journal.append(make_record(1))
    assert told == [False]
    await asyncio.sleep(0.5)  # the disk comes back
    for i in range(3):
        await journal.append(make_record(2 + i))
    assert await journal.probe()
    await journal.close()
    assert told == [False, True]


async def test_usage_sums_split_where_prices_change(tmp_path: Path) -> None:
    """The budgets' rebuild reads sums per quarter hour; with cuts (the instants prices
    change) no sum spans one, and cached tokens and audio seconds are summed too."""
    journal = Journal(tmp_path / "j.sqlite")
    await journal.open()
    cut = datetime(2026, 11, 15, 11, 7, 30, tzinfo=UTC)
    for offset, prompt in ((-1, 10), (0, 20), (1, 40)):  # a microsecond before, at, after
        moment = cut + timedelta(microseconds=offset)
        record = make_record(0, billed=prompt).model_copy(
            update={"time": moment, "units": Units(prompt_tokens=prompt, cached_prompt_tokens=5)}
        )
        await journal.append(record)
    since = datetime(2026, 11, 1, tzinfo=UTC)
    whole = await journal.usage_since(since, 900)
    split = await journal.usage_since(since, 900, [cut, cut + timedelta(days=1)])
    await journal.close()
    assert [(s.prompt, s.cached, s.records, s.segment) for s in whole] == [(70, 15, 3, 0)]
    found = sorted((s.segment, s.prompt, s.records) for s in split)
    assert found == [(0, 10, 1), (1, 60, 2)]
    assert {s.start for s in split} == {int(datetime(2026, 11, 15, 11, tzinfo=UTC).timestamp())}
