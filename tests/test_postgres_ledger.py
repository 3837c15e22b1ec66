"""The PostgreSQL ledger against a real server: idempotent inserts, outages, reports."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg

from proxy.journal import Journal
from proxy.outbox import Outbox
from proxy.records import UsageRecord
from proxy.sinks.postgres import PostgresLedger, read_ledger
from tests.postgres import Cluster


def make_record(i: int, tenant: str = "acme", reported: int = 57, billed: int = 36) -> UsageRecord:
    return UsageRecord(
        client_request_id=f"req-{uuid.uuid4().hex}-{i}",
        tenant=tenant,
        model="minilm",
        endpoint="/rerank",
        operation="rerank",
        prompt_tokens_reported=reported,
        prompt_tokens_billed=billed,
        verdict="corrected",
        m=1,
        n=3,
        status=200,
        latency_ms=1.5,
        instance="test",
    )


async def fresh_database(cluster: Cluster) -> str:
    name = f"t_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(cluster.dsn)
    await conn.execute(f"CREATE DATABASE {name}")
    await conn.close()
    return cluster.dsn.rsplit("/", 1)[0] + "/" + name


async def count_rows(dsn: str) -> tuple[int, int]:
    conn = await asyncpg.connect(dsn)
    try:
        total = await conn.fetchval("SELECT count(*) FROM usage_records")
        distinct = await conn.fetchval("SELECT count(DISTINCT record_id) FROM usage_records")
    finally:
        await conn.close()
    return int(total), int(distinct)


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
