"""The PostgreSQL ledger: one row per record, inserted idempotently on ``record_id``."""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from typing import Any

import asyncpg

from proxy.ledger.records import Units, UsageRecord
from proxy.ledger.sinks import PermanentDeliveryError
from proxy.ledger.windows import Entry, SettledWindow


def _statements(migration: str) -> str:
    lines = [line for line in migration.splitlines() if not line.startswith("--")]
    return "\n".join(s for s in lines if s not in ("BEGIN;", "COMMIT;"))


def ledger_sql() -> tuple[str, str, str, str]:
    """The ledger's DDL and the schema-version-1, -2 and -3 migrations (without their
    BEGIN/COMMIT: the proxy runs them in its own transaction)."""
    text = (resources.files("proxy.ledger.sinks") / "ledger.sql").read_text(encoding="utf-8")
    ddl, _, migrations = text.partition("-- migrate: schema version 1 to 2\n")
    v1, _, migrations = migrations.partition("-- migrate: schema version 2 to 3\n")
    v2, _, v3 = migrations.partition("-- migrate: schema version 3 to 4\n")
    return ddl, _statements(v1), _statements(v2), _statements(v3)


# The DDL lives in ledger.sql beside this module, the one copy (teams that migrate schemas
# themselves run the same file). Token counts are bigint: the ledger holds every count a
# record may carry (wire.usage.MAX_TOKENS).
LEDGER_DDL, MIGRATE_V1, MIGRATE_V2, MIGRATE_V3 = ledger_sql()
_HAS_COLUMN = (
    "SELECT 1 FROM information_schema.columns WHERE table_name = 'usage_records' "
    "AND column_name = $1 AND table_schema = current_schema()"
)


async def migrate(conn: Any) -> None:
    """Create the ledger table, or bring a schema-version-1, -2 or -3 table to version 4,
    in one transaction (no row is lost or half-migrated)."""
    async with conn.transaction():
        table = await conn.fetchval("SELECT to_regclass('usage_records')")
        if await conn.fetchval(_HAS_COLUMN, "request_id"):
            await conn.execute(MIGRATE_V1)
        if table is not None and not await conn.fetchval(_HAS_COLUMN, "units"):
            await conn.execute(MIGRATE_V2)
        if table is not None and not await conn.fetchval(_HAS_COLUMN, "trace_id"):
            await conn.execute(MIGRATE_V3)
        await conn.execute(LEDGER_DDL)


COLUMNS_AND_TYPES = (
    ("record_id", "uuid"),
    ("schema_version", "int"),
    ("client_request_id", "text"),
    ("time", "timestamptz"),
    ("tenant", "text"),
    ("key_hash", "text"),
    ("model", "text"),
    ("endpoint", "text"),
    ("operation", "text"),
    ("upstream_version", "text"),
    ("prompt_tokens_reported", "int8"),
    ("prompt_tokens_billed", "int8"),
    ("completion_tokens_reported", "int8"),
    ("completion_tokens_billed", "int8"),
    ("verdict", "text"),
    ("m", "int8"),
    ("n", "int8"),
    ("status", "int"),
    ("aborted", "bool"),
    ("latency_ms", "float8"),
    ("instance", "text"),
    ("units", "jsonb"),
    ("trace_id", "text"),
    ("traceparent", "text"),
)
COLUMNS = tuple(c for c, _ in COLUMNS_AND_TYPES)
_ARRAYS = ", ".join(f"${i + 1}::{t}[]" for i, (_, t) in enumerate(COLUMNS_AND_TYPES))
INSERT = (
    f"INSERT INTO usage_records ({', '.join(COLUMNS)}) SELECT * FROM unnest({_ARRAYS}) "
    "ON CONFLICT (record_id) DO NOTHING"
)
INSERT_WINDOW = (
    "INSERT INTO reconciliation_windows (window_id, instance, upstream, start_time, end_time, "
    "status, body) VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb) ON CONFLICT (window_id) DO NOTHING"
)
# SQLSTATE classes that depend on the rows sent, not on the server's state: data
# exceptions (22) and integrity violations (23). Everything else is retried.
PERMANENT_SQLSTATE_CLASSES = ("22", "23")


def _row(record: UsageRecord) -> list[Any]:
    data = record.model_dump()
    # Only the units the engine reported: a missing key is "not reported", as in the record.
    data["units"] = record.units.model_dump_json(exclude_none=True)
    return [data[c] for c in COLUMNS]


class PostgresLedger:
    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.name = "postgres"
        self._pool: asyncpg.Pool | None = None

    async def _connect(self) -> asyncpg.Pool:
        if self._pool is None:
            pool = await asyncpg.create_pool(self.dsn, min_size=0, max_size=2, timeout=10)
            try:
                async with pool.acquire() as conn:
                    await migrate(conn)
            except BaseException:
                # the outbox tries again with a new pool: this one's connection must not
                # stay open (one leaked at each try; another replica creating the table
                # at the same moment fails a first delivery so). terminate: at once, even
                # when cancelled
                pool.terminate()
                raise
            self._pool = pool
        return self._pool

    async def start(self) -> None:
        """Connect lazily: the ledger may be down at start-up; the outbox retries."""
        return None

    async def deliver(self, records: Sequence[Entry]) -> None:
        pool = await self._connect()
        usage = [r for r in records if isinstance(r, UsageRecord)]
        windows = [r for r in records if isinstance(r, SettledWindow)]
        columns = list(zip(*(_row(r) for r in usage), strict=True))
        try:
            async with pool.acquire() as conn, conn.transaction():
                if usage:
                    await conn.execute(INSERT, *[list(c) for c in columns])
                for w in windows:
                    await conn.execute(
                        INSERT_WINDOW,
                        w.window_id,
                        w.instance,
                        w.upstream,
                        w.start,
                        w.end,
                        w.status,
                        w.to_json(),
                    )
        except asyncpg.PostgresError as exc:
            if str(exc.sqlstate or "")[:2] in PERMANENT_SQLSTATE_CLASSES:
                raise PermanentDeliveryError(f"{exc.sqlstate}: {exc}") from exc
            raise

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
    return [_record(dict(r)) for r in rows]


async def read_page(
    dsn: str,
    since: str,
    until: str,
    tenant: str | None,
    after: tuple[str, str] | None,
    limit: int | None,
) -> list[UsageRecord]:
    """Records from the ledger in [since, until), of ``tenant`` (None: everyone's), after
    the (time, record id) ``after``, at most ``limit``, in that order."""
    from datetime import datetime

    moment, last = after or (since, "00000000-0000-0000-0000-000000000000")
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        rows = await conn.fetch(
            f"SELECT {', '.join(COLUMNS)} FROM usage_records "
            "WHERE time >= $1 AND time < $2 AND ($3::text IS NULL OR tenant = $3) "
            "AND (time, record_id) > ($4, $5::uuid) ORDER BY time, record_id LIMIT $6",
            _aware(datetime.fromisoformat(since)),
            _aware(datetime.fromisoformat(until)),
            tenant,
            _aware(datetime.fromisoformat(moment)),
            last,
            limit,
        )
    finally:
        await conn.close()
    return [_record(dict(r)) for r in rows]


async def read_record(dsn: str, record_id: str) -> UsageRecord | None:
    """The ledger's record with this id (a UUID), if it has one."""
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        row = await conn.fetchrow(
            f"SELECT {', '.join(COLUMNS)} FROM usage_records WHERE record_id = $1::uuid",
            record_id,
        )
    finally:
        await conn.close()
    return _record(dict(row)) if row is not None else None


def _record(row: dict[str, Any]) -> UsageRecord:
    units = row.pop("units")
    row["record_id"] = str(row["record_id"])
    if units is not None:  # asyncpg hands jsonb over as its text
        row["units"] = Units.model_validate_json(units)
    return UsageRecord(**row)


def _aware(moment: Any) -> Any:
    from datetime import UTC

    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
