"""The records a question reads (``lookup``): from this replica's journal, or from the
PostgreSQL ledger when one is configured (a record it has not been delivered yet read
from the journal); ranges by tenant, a page at a time in (time, record id) order."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

from proxy.ledger.lookup import RecordSource
from proxy.ledger.records import UsageRecord
from proxy.ledger.shards import shard_path
from proxy.ledger.sinks.postgres import PostgresLedger
from proxy.ledger.sqlite import as_row, create_schema
from tests.support.postgres import Cluster, fresh_database
from tests.support.records import make_record

START = datetime(2026, 12, 1, tzinfo=UTC)
SINCE, UNTIL = START.isoformat(), (START + timedelta(days=1)).isoformat()


def records() -> list[UsageRecord]:
    """Seven records a minute apart, two of them at one instant; acme's and globex's."""
    made = []
    for i in range(7):
        at = START + timedelta(minutes=min(i, 5))
        made.append(
            make_record(i, "globex" if i % 3 == 0 else "acme").model_copy(update={"time": at})
        )
    return made


def journal(path: Path, made: list[UsageRecord]) -> Path:
    db = sqlite3.connect(path)
    create_schema(db)
    db.executemany(
        "INSERT INTO records(record_id, time, tenant, body, kind) VALUES (?,?,?,?,?)",
        [as_row(r) for r in made],
    )
    db.commit()
    db.close()
    return path


def order(made: list[UsageRecord]) -> list[str]:
    return [r.record_id for r in sorted(made, key=lambda r: (r.time, r.record_id))]


def pages(source: RecordSource, tenant: str | None, size: int) -> list[list[str]]:
    """Every page of the day's records, each read after the last one's place."""
    out, after = [], None
    while True:
        page = source.page(SINCE, UNTIL, tenant, after, size)
        if not page:
            return out
        out.append([r.record_id for r in page])
        after = (page[-1].time.isoformat(), page[-1].record_id)


def test_the_journal_is_read_by_range_tenant_and_page(tmp_path: Path) -> None:
    """Pages of 2 cover every record once in order, a tie of times included; a tenant's
    range holds its records only; the source says it is this replica's journal."""
    made = records()
    source = RecordSource(None, journal(tmp_path / "j.sqlite", made))
    assert [i for page in pages(source, None, 2) for i in page] == order(made)
    acme = [r for r in made if r.tenant == "acme"]
    assert [r.record_id for r in source.page(SINCE, UNTIL, "acme")] == order(acme)
    later = (START + timedelta(minutes=4)).isoformat()
    assert len(source.page(later, UNTIL)) == 3
    assert source.describe() == {"source": "journal", "holds": "this replica's records only"}


def test_a_record_is_found_by_its_id(tmp_path: Path) -> None:
    """A journaled record by id; an unknown id, or no journal yet, finds nothing."""
    made = records()
    source = RecordSource(None, journal(tmp_path / "j.sqlite", made))
    assert source.record(made[2].record_id) == made[2]
    assert source.record("no-such-id") is None
    assert RecordSource(None, tmp_path / "none.sqlite").record(made[2].record_id) is None
    assert RecordSource(None, tmp_path / "none.sqlite").page(SINCE, UNTIL) == []


async def test_the_ledger_is_read_when_configured(tmp_path: Path, postgres: Cluster) -> None:
    """With a DSN, pages and tenants come from the ledger; a record the outbox has not
    delivered yet is still found, in the journal; an id that is no UUID finds nothing."""
    made = records()
    dsn = await fresh_database(postgres)
    ledger = PostgresLedger(dsn)
    await ledger.start()
    await ledger.deliver(made[:6])
    await ledger.close()
    source = RecordSource(dsn, journal(tmp_path / "j.sqlite", made))

    def reads() -> None:  # blocking, as the API runs them: in a worker thread
        assert [i for page in pages(source, None, 4) for i in page] == order(made[:6])
        acme = [r for r in made[:6] if r.tenant == "acme"]
        assert [r.record_id for r in source.page(SINCE, UNTIL, "acme")] == order(acme)
        assert source.record(made[1].record_id) == made[1]
        assert source.record(made[6].record_id) == made[6]  # not delivered yet
        assert source.record("not-a-uuid") is None

    await asyncio.to_thread(reads)
    assert source.describe()["source"] == "ledger"


def test_a_record_id_is_found_however_its_uuid_is_written(tmp_path: Path) -> None:
    """The ledger reads an id as a UUID (upper case, braces, no hyphens all find it);
    the journal compared the text, so the same id found a record from one source and
    answered 404 from the other (review of #62). Both read it as the UUID it is; an id
    that is no UUID is still looked up as written."""
    made = records()
    source = RecordSource(None, journal(tmp_path / "j.sqlite", made))
    wanted = made[2].record_id
    for written in (wanted.upper(), "{" + wanted + "}", wanted.replace("-", "")):
        assert source.record(written) == made[2], written
    assert source.record("no-such-id") is None


def places(source: RecordSource, size: int) -> Iterator[list[str]]:
    """Pages of the day's records by their places, each after the last one's; a page
    is yielded before the next is read (so a test may append between them)."""
    after = None
    while True:
        page = source.places(SINCE, UNTIL, None, after, size)
        if not page:
            return
        yield [r.record_id for _, r in page]
        after = page[-1][0]


def test_a_pods_shards_are_read_as_one_journal(tmp_path: Path) -> None:
    """A pod's journal is every worker's shard: a range, a tenant's range and a record
    by id cover both shards, each record once, in (time, record id) order (before: only
    the file at ``--journal`` was read)."""
    made = records()
    path = journal(tmp_path / "j.sqlite", made[0::2])
    journal(shard_path(path, 1), made[1::2])
    source = RecordSource(None, path)
    assert [r.record_id for r in source.page(SINCE, UNTIL)] == order(made)
    assert [i for page in pages(source, None, 2) for i in page] == order(made)
    acme = [r for r in made if r.tenant == "acme"]
    assert [r.record_id for r in source.page(SINCE, UNTIL, "acme")] == order(acme)
    assert source.record(made[1].record_id) == made[1]
    assert source.record(made[2].record_id) == made[2]


def test_paging_over_shards_skips_no_record_appended_meanwhile(tmp_path: Path) -> None:
    """Pages of 2 by place cover both shards' records once; a record appended to either
    shard after a page was read, with a time before that page's records, is on a later
    page (a place is each shard's last seq read, not a time)."""
    made = records()
    late = [make_record(10 + i, "acme").model_copy(update={"time": START}) for i in range(2)]
    path = journal(tmp_path / "j.sqlite", made[:4])
    other = journal(shard_path(path, 1), made[4:])
    source = RecordSource(None, path)
    seen = []
    for n, page in enumerate(places(source, 2)):
        seen += page
        if n < 2:
            append(path if n == 0 else other, [late[n]])
    assert sorted(seen) == sorted(r.record_id for r in made + late)
    assert len(seen) == len(set(seen))


def test_a_record_in_two_shards_is_read_once(tmp_path: Path) -> None:
    """A record journaled in two shards (a defect, never two records) counts once."""
    made = records()
    path = journal(tmp_path / "j.sqlite", made)
    journal(shard_path(path, 1), made[:2])
    source = RecordSource(None, path)
    assert [r.record_id for r in source.page(SINCE, UNTIL)] == order(made)


def append(path: Path, made: list[UsageRecord]) -> None:
    """Records appended to an existing journal file."""
    db = sqlite3.connect(path)
    db.executemany(
        "INSERT INTO records(record_id, time, tenant, body, kind) VALUES (?,?,?,?,?)",
        [as_row(r) for r in made],
    )
    db.commit()
    db.close()
