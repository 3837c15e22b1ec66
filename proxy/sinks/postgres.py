"""The PostgreSQL ledger: one row per record, inserted idempotently on ``record_id``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg

from proxy.records import UsageRecord

# Also shipped as docs/ledger.sql for teams that migrate schemas themselves.
LEDGER_DDL = """
CREATE TABLE IF NOT EXISTS usage_records (
    record_id uuid PRIMARY KEY,
    schema_version integer NOT NULL,
    request_id text NOT NULL,
    time timestamptz NOT NULL,
    tenant text NOT NULL,
    key_hash text,
    model text,
    endpoint text NOT NULL,
    operation text NOT NULL,
    upstream_version text,
    prompt_tokens_reported integer,
    prompt_tokens_billed integer,
    completion_tokens_reported integer,
    completion_tokens_billed integer,
    verdict text,
    m integer,
    n integer,
    status integer NOT NULL,
    latency_ms double precision NOT NULL,
    instance text NOT NULL,
    inserted_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS usage_records_tenant_time ON usage_records (tenant, time);
"""

COLUMNS = (
    "record_id",
    "schema_version",
    "request_id",
    "time",
    "tenant",
    "key_hash",
    "model",
    "endpoint",
    "operation",
    "upstream_version",
    "prompt_tokens_reported",
    "prompt_tokens_billed",
    "completion_tokens_reported",
    "completion_tokens_billed",
    "verdict",
    "m",
    "n",
    "status",
    "latency_ms",
    "instance",
)
TYPES = (
    "uuid",
    "int",
    "text",
    "timestamptz",
    "text",
    "text",
    "text",
    "text",
    "text",
    "text",
    "int",
    "int",
    "int",
    "int",
    "text",
    "int",
    "int",
    "int",
    "float8",
    "text",
)
_ARRAYS = ", ".join(f"${i + 1}::{t}[]" for i, t in enumerate(TYPES))
INSERT = (
    f"INSERT INTO usage_records ({', '.join(COLUMNS)}) SELECT * FROM unnest({_ARRAYS}) "
    "ON CONFLICT (record_id) DO NOTHING"
)


def _row(record: UsageRecord) -> list[Any]:
    data = record.model_dump()
    return [data[c] for c in COLUMNS]


class PostgresLedger:
    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.name = "postgres"
        self._pool: asyncpg.Pool | None = None

    async def _connect(self) -> asyncpg.Pool:
        if self._pool is None:
            pool = await asyncpg.create_pool(self.dsn, min_size=0, max_size=2, timeout=10)
            async with pool.acquire() as conn:
                await conn.execute(LEDGER_DDL)
            self._pool = pool
        return self._pool

    async def start(self) -> None:
        """Connect lazily: the ledger may be down at start-up; the outbox retries."""
        return None

    async def deliver(self, records: Sequence[UsageRecord]) -> None:
        pool = await self._connect()
        columns = list(zip(*(_row(r) for r in records), strict=True))
        async with pool.acquire() as conn:
            await conn.execute(INSERT, *[list(c) for c in columns])

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()


async def read_ledger(dsn: str, since: str | None, until: str | None) -> list[UsageRecord]:
    """Records from the ledger in [since, until) (ISO 8601), for reports."""
    from datetime import datetime

    low = datetime.fromisoformat(since) if since else datetime.min
    high = datetime.fromisoformat(until) if until else datetime.max
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        rows = await conn.fetch(
            f"SELECT {', '.join(COLUMNS)} FROM usage_records "
            "WHERE time >= $1 AND time < $2 ORDER BY time",
            _aware(low),
            _aware(high),
        )
    finally:
        await conn.close()
    return [UsageRecord(**{**dict(r), "record_id": str(r["record_id"])}) for r in rows]


def _aware(moment: Any) -> Any:
    from datetime import UTC

    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
