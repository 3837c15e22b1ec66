"""The records a question reads, from one source: the PostgreSQL ledger when one is
configured (every replica's records), else this replica's journal (its own records
only). Plain blocking reads, for a reading process: a range (a tenant's, or everyone's),
a page of it at a time, and one record by its id.

A journal's pages follow its append order (``seq``), not the records' times: a record is
timed when it is built and journaled after its exchange settles, so records arrive a
little out of time order, and paging by time missed one appended meanwhile with a time
before the last page's end. The ledger's pages follow (time, record id)."""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from dataclasses import dataclass
from pathlib import Path

from proxy.ledger.records import UsageRecord
from proxy.ledger.sqlite import open_existing

# A page's place: the (time, record id) of the last record it held in the ledger; in a
# journal ("", its seq).
After = tuple[str, str]

RANGE = (
    "SELECT body FROM records WHERE kind = 'usage' AND time >= ? AND time < ? "
    "AND (? IS NULL OR tenant = ?) AND (time > ? OR (time = ? AND record_id > ?)) "
    "ORDER BY time, record_id LIMIT ?"
)
APPENDED = (
    "SELECT seq, body FROM records WHERE kind = 'usage' AND time >= ? AND time < ? "
    "AND (? IS NULL OR tenant = ?) AND seq > ? ORDER BY seq LIMIT ?"
)


@dataclass(frozen=True, slots=True)
class RecordSource:
    """Where records are read: ``dsn`` (the ledger) or else ``journal``."""

    dsn: str | None
    journal: Path | None

    def describe(self) -> dict[str, str]:
        """Which source a question read, and whose records it holds."""
        if self.dsn is not None:
            return {"source": "ledger", "holds": "every replica's records"}
        return {"source": "journal", "holds": "this replica's records only"}

    def page(
        self,
        since: str,
        until: str,
        tenant: str | None = None,
        after: After | None = None,
        limit: int | None = None,
    ) -> list[UsageRecord]:
        """Records in ``[since, until)`` (ISO 8601, UTC), of ``tenant`` or everyone's,
        after ``after``, at most ``limit``, in (time, record id) order."""
        if self.dsn is not None:
            from proxy.ledger.sinks.postgres import read_page  # asyncpg only when asked

            return asyncio.run(read_page(self.dsn, since, until, tenant, after, limit))
        start, last = after or ("", "")
        args = (since, until, tenant, tenant, start, start, last, -1 if limit is None else limit)
        return [UsageRecord.from_json(body) for body in self._journal(RANGE, args)]

    def places(
        self, since: str, until: str, tenant: str | None, after: After | None, limit: int
    ) -> list[tuple[After, UsageRecord]]:
        """A page of ``page``'s range, each record with its place (what a next page
        starts after): a journal's in its append order, the ledger's in (time, record
        id) order."""
        if self.dsn is not None:
            found = self.page(since, until, tenant, after, limit)
            return [((r.time.isoformat(), r.record_id), r) for r in found]
        seq = int(after[1]) if after is not None and not after[0] else 0
        args = (since, until, tenant, tenant, seq, limit)
        rows = self._journal_rows(APPENDED, args)
        return [(("", str(place)), UsageRecord.from_json(str(body))) for place, body in rows]

    def record(self, record_id: str) -> UsageRecord | None:
        """The record with this id (None: no such record); one the ledger does not have
        yet (the outbox delivers later) is read from this replica's journal."""
        record_id = _canonical(record_id)
        if self.dsn is not None and _is_uuid(record_id):
            from proxy.ledger.sinks.postgres import read_record

            found = asyncio.run(read_record(self.dsn, record_id))
            if found is not None:
                return found
        query = "SELECT body FROM records WHERE kind = 'usage' AND record_id = ?"
        bodies = self._journal(query, (record_id,))
        return UsageRecord.from_json(bodies[0]) if bodies else None

    def _journal(self, query: str, args: tuple[object, ...]) -> list[str]:
        return [str(body) for (body,) in self._journal_rows(query, args)]

    def _journal_rows(self, query: str, args: tuple[object, ...]) -> list[tuple[object, ...]]:
        if self.journal is None:
            return []
        try:
            db = open_existing(self.journal, writable=False)
        except FileNotFoundError:  # nothing journaled yet
            return []
        try:
            return [tuple(row) for row in db.execute(query, args)]
        except sqlite3.OperationalError:  # a journal not yet given its schema
            return []
        finally:
            db.close()


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def _canonical(text: str) -> str:
    """An id as the proxy writes it: a UUID however written (case, braces, hyphens) in
    its canonical form, as the ledger reads it; anything else as it is."""
    try:
        return str(uuid.UUID(text))
    except ValueError:
        return text
