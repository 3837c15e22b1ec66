"""The PostgreSQL ledger against a real server: idempotent inserts, outages, reports."""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest

from proxy.cli import main
from proxy.ledger.journal import Journal
from proxy.ledger.journal_files import list_dead_letters
from proxy.ledger.outbox import Outbox
from proxy.ledger.records import Units, UsageRecord
from proxy.ledger.sinks.postgres import PostgresLedger, migrate, read_ledger
from proxy.metrics import Metrics
from proxy.settings import Settings
from proxy.wire.usage import MAX_TOKENS
from tests.support.postgres import Cluster, fresh_database
from tests.support.records import make_record
from tests.support.waits import eventually


async def count_rows(dsn: str) -> tuple[int, int]:
    conn = await asyncpg.connect(dsn)
    try:
        total = await conn.fetchval("SELECT count(*) FROM usage_records")
        distinct = await conn.fetchval("SELECT count(DISTINCT record_id) FROM usage_records")
    finally:
        await conn.close()
    return int(total), int(distinct)


LEDGER_V1 = Path(__file__).resolve().parents[3] / "data" / "ledger_v1.sql"


async def test_redelivery_is_idempotent(postgres: Cluster) -> None:
    """Delivering the same batch twice leaves one row per record."""
    dsn = await fresh_database(postgres)
    ledger = PostgresLedger(dsn)
    records = [make_record(i) for i in range(50)]
    await ledger.deliver(records)
    await ledger.deliver(records[10:30])
    await ledger.close()
    assert await count_rows(dsn) == (50, 50)
    back = await read_ledger(dsn, None, None)
    assert {r.record_id for r in back} == {r.record_id for r in records}
    assert sum(r.prompt_tokens_billed or 0 for r in back) == 50 * 36


async def test_time_range_of_ledger_reads(postgres: Cluster) -> None:
    """read_ledger keeps [since, until)."""
    dsn = await fresh_database(postgres)
    ledger = PostgresLedger(dsn)
    now = datetime.now(UTC)
    old = make_record(1).model_copy(update={"time": now - timedelta(days=2)})
    new = make_record(2)
    await ledger.deliver([old, new])
    await ledger.close()
    since = (now - timedelta(days=1)).isoformat()
    assert [r.record_id for r in await read_ledger(dsn, since, None)] == [new.record_id]


async def test_outage_then_recovery_delivers_exactly_once(postgres: Cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The ledger is down while records are journaled; after it returns all arrive once."""
    dsn = await fresh_database(postgres)
    journal = Journal(tmp_path / "j.sqlite")
    await journal.open()
    ledger = PostgresLedger(dsn)
    outbox = Outbox(
        journal, [ledger], batch_size=40, min_backoff=0.05, max_backoff=0.3, poll_interval=0.05
    )
    postgres.stop()
    try:
        await outbox.start()
        records = [make_record(i) for i in range(300)]
        await asyncio.gather(*(journal.append(r) for r in records))
        await asyncio.sleep(0.5)
        assert outbox.state["postgres"].failures > 0
        assert await journal.backlog("postgres") == 300
    finally:
        postgres.start()
    for _ in range(200):
        if await journal.backlog("postgres") == 0:
            break
        await asyncio.sleep(0.05)
    backlog = await outbox.drain(5)
    await journal.close()
    assert backlog == {"postgres": 0}
    assert await count_rows(dsn) == (300, 300)


async def test_permanent_rejection_is_isolated_dead_lettered_and_replayable(
    postgres: Cluster, tmp_path: Path
) -> None:
    """Regression: one row the ledger refused (then: an out-of-range count in an integer
    column) was retried forever and blocked every later record. Now the batch is split,
    the rest is delivered, the refused record waits in the dead-letter store, visible in
    the metric and the CLI, and replays once the cause is fixed."""
    dsn = await fresh_database(postgres)
    conn = await asyncpg.connect(dsn)
    await migrate(conn)
    await conn.execute("ALTER TABLE usage_records ADD CONSTRAINT no_evil CHECK (tenant <> 'evil')")
    journal = Journal(tmp_path / "j.sqlite")
    await journal.open()
    metrics = Metrics(Settings(upstream="http://x"))
    outbox = Outbox(
        journal,
        [PostgresLedger(dsn)],
        batch_size=50,
        min_backoff=0.05,
        max_backoff=0.2,
        poll_interval=0.05,
        metrics=metrics,
    )
    await outbox.start()
    records = [make_record(i, tenant="evil" if i == 17 else "acme") for i in range(40)]
    for record in records:
        await journal.append(record)

    async def delivered() -> bool:
        return await journal.backlog("postgres") == 0

    await eventually(delivered)
    assert await count_rows(dsn) == (39, 39)
    assert 'usage_proxy_export_dead_records{sink="postgres"} 1.0' in metrics.render().decode()
    (letter,) = list_dead_letters(tmp_path / "j.sqlite")
    assert (letter.record_id, letter.sink) == (records[17].record_id, "postgres")
    assert "23514" in letter.error
    listing = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "proxy", "dead-letters", "list", "--journal", str(journal.path)),
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await listing.communicate()
    assert records[17].record_id in out.decode()

    await conn.execute("ALTER TABLE usage_records DROP CONSTRAINT no_evil")
    assert main(["dead-letters", "replay", "--journal", str(journal.path)]) == 0

    async def replayed() -> bool:
        return await count_rows(dsn) == (40, 40)

    await eventually(replayed)
    await conn.close()
    await outbox.drain(2)
    await journal.close()
    assert list_dead_letters(tmp_path / "j.sqlite") == []


async def test_transient_errors_are_retried_not_dead_lettered(
    postgres: Cluster, tmp_path: Path
) -> None:
    """A missing table (the schema is being migrated) is the ledger's state, not the
    records': retried until it is back, nothing dead-lettered."""
    dsn = await fresh_database(postgres)
    ledger = PostgresLedger(dsn)
    await ledger.deliver([make_record(0)])
    conn = await asyncpg.connect(dsn)
    await conn.execute("ALTER TABLE usage_records RENAME TO usage_records_away")
    with pytest.raises(asyncpg.UndefinedTableError):
        await ledger.deliver([make_record(1)])
    await conn.execute("ALTER TABLE usage_records_away RENAME TO usage_records")
    await conn.close()
    await ledger.close()


async def test_counts_beyond_int32_fit_the_ledger(postgres: Cluster) -> None:
    """Regression: 3,000,000,000 prompt tokens was refused by an integer column."""
    dsn = await fresh_database(postgres)
    ledger = PostgresLedger(dsn)
    await ledger.deliver([make_record(0, reported=MAX_TOKENS, billed=3_000_000_000)])
    await ledger.close()
    (back,) = await read_ledger(dsn, None, None)
    assert (back.prompt_tokens_reported, back.prompt_tokens_billed) == (MAX_TOKENS, 3_000_000_000)


async def test_schema_version_1_table_is_migrated(postgres: Cluster) -> None:
    """An existing v1 ledger (request_id, integer counts) is migrated in place on first
    delivery; its rows stay, new v2 rows land beside them."""
    dsn = await fresh_database(postgres)
    conn = await asyncpg.connect(dsn)
    v1 = LEDGER_V1.read_text()
    await conn.execute(v1)
    await conn.execute(
        "INSERT INTO usage_records (record_id, schema_version, request_id, time, tenant, "
        "endpoint, operation, prompt_tokens_billed, status, latency_ms, instance) VALUES "
        "('6f0c8d52-3a4e-5b8f-9c1d-2e7a4b6c8d90', 1, 'old-1', now(), 'acme', '/rerank', "
        "'rerank', 36, 200, 1.0, 'old')"
    )
    ledger = PostgresLedger(dsn)
    await ledger.deliver([make_record(0, billed=3_000_000_000)])
    await ledger.close()
    rows = await conn.fetch(
        "SELECT client_request_id, prompt_tokens_billed, aborted FROM usage_records ORDER BY time"
    )
    kind = await conn.fetchval(
        "SELECT data_type FROM information_schema.columns "
        "WHERE table_name = 'usage_records' AND column_name = 'prompt_tokens_billed'"
    )
    await conn.close()
    assert kind == "bigint"
    assert [(r["client_request_id"][:4], r["prompt_tokens_billed"]) for r in rows] == [
        ("old-", 36),
        ("req-", 3_000_000_000),
    ]
    assert [r["aborted"] for r in rows] == [False, False]


LEDGER_V2 = Path(__file__).resolve().parents[3] / "data" / "ledger_v2.sql"


async def test_schema_version_2_table_is_upgraded_with_units(postgres: Cluster) -> None:
    """An existing v2 ledger gains the units column in place: every v2 row stays, with its
    billed tokens as units, and v3 rows with audio seconds and cached tokens land beside."""
    dsn = await fresh_database(postgres)
    conn = await asyncpg.connect(dsn)
    await conn.execute(LEDGER_V2.read_text())
    for i in range(3):
        await conn.execute(
            "INSERT INTO usage_records (record_id, schema_version, time, tenant, endpoint, "
            "operation, prompt_tokens_billed, completion_tokens_billed, status, latency_ms, "
            "instance) VALUES ($1, 2, now(), 'acme', '/v1/chat/completions', 'chat', $2, $3, "
            "200, 1.0, 'old')",
            f"01920000-0000-7000-8000-00000000000{i}",
            10 + i,
            None if i == 0 else 5,
        )
    base = make_record(0).model_dump(exclude={"record_id", "schema_version", "units"})
    audio = UsageRecord(
        **{**base, "prompt_tokens_reported": None, "prompt_tokens_billed": None},
        units=Units(audio_seconds=7),
    )
    cached = UsageRecord(**base, units=Units(cached_prompt_tokens=32))
    ledger = PostgresLedger(dsn)
    await ledger.deliver([audio, cached])
    await ledger.close()
    stored = await conn.fetch("SELECT schema_version, units::text FROM usage_records ORDER BY 1")
    await conn.close()
    assert [(r[0], json.loads(r[1])) for r in stored][:3] == [
        (2, {"prompt_tokens": 10}),
        (2, {"prompt_tokens": 11, "completion_tokens": 5}),
        (2, {"prompt_tokens": 12, "completion_tokens": 5}),
    ]
    back = await read_ledger(dsn, None, None)
    assert len(back) == 5
    old = sorted((r.units.reported() for r in back if r.schema_version == 2), key=str)
    assert old == [
        {"prompt_tokens": 10},
        {"prompt_tokens": 11, "completion_tokens": 5},
        {"prompt_tokens": 12, "completion_tokens": 5},
    ]
    by_id = {r.record_id: r for r in back}
    assert by_id[audio.record_id].units == Units(audio_seconds=7)
    assert by_id[cached.record_id].units == Units(prompt_tokens=36, cached_prompt_tokens=32)


def test_the_ledger_is_priced_as_the_journal_is(
    postgres: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``report --prices`` re-prices the ledger's records at their times, as it does the
    journal's: the same lines and amounts due from either source (a price change between
    two of them included)."""
    change = datetime(2026, 11, 15, 12, 30, tzinfo=UTC)
    records = [
        make_record(i, tenant=t, billed=b).model_copy(update={"time": change + timedelta(hours=h)})
        for i, (t, b, h) in enumerate([("a", 36_000, -1), ("a", 12_345, 0), ("b", 777, 5)])
    ]
    journal = Journal(tmp_path / "j.sqlite")

    async def keep() -> str:  # the report runs its own event loop: set up in another
        dsn = await fresh_database(postgres)
        await journal.open()
        for r in records:
            await journal.append(r)
        await journal.close()
        ledger = PostgresLedger(dsn)
        await ledger.deliver(records)
        await ledger.close()
        return dsn

    dsn = asyncio.run(keep())
    prices = tmp_path / "prices.yaml"
    prices.write_text(
        "currency: EUR\nmodels:\n  minilm:\n"
        "    - {prompt_tokens: '0.0000013'}\n"
        f"    - {{from: '{change.isoformat()}', prompt_tokens: '0.0000017'}}\n"
    )
    said = []
    for source in (["--journal", str(journal.path)], ["--ledger-dsn", dsn]):
        argv = ["report", *source, "--prices", str(prices), "--format", "json"]
        assert main(argv) == 0
        said.append(json.loads(capsys.readouterr().out)["charges"])
    assert said[0] == said[1]
    assert [t["due"] for t in said[1]["tenants"]] == ["0.07", "0.00"]  # 0.0678865; 0.0013209


LEDGER_V3 = Path(__file__).resolve().parents[3] / "data" / "ledger_v3.sql"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def test_schema_version_3_table_gains_the_trace(postgres: Cluster) -> None:
    """An existing v3 ledger gains trace_id and traceparent in place: every v3 row stays
    as it was (no trace: none was sent then), and v4 rows land beside them with theirs,
    found by trace id (the start of a billing dispute)."""
    dsn = await fresh_database(postgres)
    conn = await asyncpg.connect(dsn)
    await conn.execute(LEDGER_V3.read_text())
    for i in range(3):
        await conn.execute(
            "INSERT INTO usage_records (record_id, schema_version, time, tenant, endpoint, "
            "operation, prompt_tokens_billed, status, latency_ms, instance, units) VALUES "
            "($1, 3, now(), 'acme', '/rerank', 'rerank', $2, 200, 1.0, 'old', $3::jsonb)",
            f"01930000-0000-7000-8000-00000000000{i}",
            36 + i,
            json.dumps({"prompt_tokens": 36 + i}),
        )
    traced = make_record(0).model_copy(
        update={"trace_id": TRACEPARENT[3:35], "traceparent": TRACEPARENT}
    )
    ledger = PostgresLedger(dsn)
    await ledger.deliver([traced])
    await ledger.close()
    found = await conn.fetch(
        "SELECT record_id::text, traceparent FROM usage_records WHERE trace_id = $1",
        traced.trace_id,
    )
    await conn.close()
    assert [(r[0], r[1]) for r in found] == [(traced.record_id, TRACEPARENT)]
    back = {r.record_id: r for r in await read_ledger(dsn, None, None)}
    assert len(back) == 4
    old = [r for r in back.values() if r.schema_version == 3]
    assert sorted(r.prompt_tokens_billed or 0 for r in old) == [36, 37, 38]
    assert {(r.trace_id, r.traceparent) for r in old} == {(None, None)}
    assert back[traced.record_id] == traced


async def test_a_failed_first_delivery_leaves_no_connection_open(postgres: Cluster) -> None:
    """A ledger whose table cannot be made (here a type holds its name; in production two
    replicas' first deliveries racing to create it) fails the delivery, which the outbox
    retries, and keeps no connection open: the pool made for it is closed. Found by the
    audit of #62: the pool was dropped unclosed, a connection leaked at each failed try,
    and an event loop (uvloop) with one open never finished closing (so the deliveries
    run here on an asyncio loop of their own: before the fix this test fails, not hangs)."""
    dsn = await fresh_database(postgres)
    await admin_count(dsn, "CREATE TYPE usage_records AS (x int)")

    async def deliver_twice() -> None:
        ledger = PostgresLedger(dsn)
        for _ in range(2):
            with pytest.raises(asyncpg.PostgresError):
                await ledger.deliver([make_record(1)])
        others = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        open_ = await admin_count(dsn, others + " AND pid <> pg_backend_pid()")
        await ledger.close()
        assert open_ == 0

    await asyncio.to_thread(asyncio.run, deliver_twice())


async def admin_count(dsn: str, query: str) -> int | None:
    """``query`` on a connection of its own; its count, if it is one."""
    conn = await asyncpg.connect(dsn)
    try:
        found = await conn.fetchval(query)
        return int(found) if found is not None else None
    finally:
        await conn.close()
