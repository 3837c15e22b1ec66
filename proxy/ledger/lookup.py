"""The records a question reads, from one source: the PostgreSQL ledger when one is
configured (every replica's records), else this replica's journal: every shard of it
(``proxy.ledger.shards``: in a pod of ``serve --workers N``, every worker's, adopted
ones too), each record once. Plain blocking reads, for a reading process: a range (a
tenant's, or everyone's), a page of it at a time, and one record by its id.

A journal's pages follow each shard's append order (``seq``), not the records' times: a
record is timed when it is built and journaled after its exchange settles, so records
arrive a little out of time order, and paging by time missed one appended meanwhile with
a time before the last page's end. A journal's page place is each shard's last seq read
(``Marks``): a record appended to any shard after a page was read has a higher seq there,
so a later page holds it. The shards' records are merged by time within a page. The
ledger's pages follow (time, record id)."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from proxy.ledger.records import UsageRecord
from proxy.ledger.shards import numbered
from proxy.ledger.sqlite import open_existing

# A page's place: the (time, record id) of the last record it held in the ledger; in a
# journal ("", each shard's last seq read, as ``marks_text`` writes them).
After = tuple[str, str]
# A journal's place: each shard's index to the last seq read there (absent: none read).
Marks = dict[int, int]

LEDGER = {"source": "ledger", "holds": "every replica's records"}
JOURNAL = {"source": "journal", "holds": "this replica's records only"}
RANGE = (
    "SELECT body FROM records WHERE kind = 'usage' AND time >= ? AND time < ? "
    "AND (? IS NULL OR tenant = ?) AND (time > ? OR (time = ? AND record_id > ?)) "
    "ORDER BY time, record_id LIMIT ?"
)
APPENDED = (
    "SELECT seq, time, body FROM records WHERE kind = 'usage' AND time >= ? AND time < ? "
    "AND (? IS NULL OR tenant = ?) AND seq > ? ORDER BY seq LIMIT ?"
)


@dataclass(frozen=True, slots=True)
class RecordSource:
    """Where records are read: ``dsn`` (the ledger) or else ``journal`` and every shard
    of it (a pod's: pass the pod's journal, not a worker's shard)."""

    dsn: str | None
    journal: Path | None

    def describe(self) -> dict[str, str]:
        """Which source a question read, and whose records it holds."""
        return dict(LEDGER if self.dsn is not None else JOURNAL)

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
        found = _once(UsageRecord.from_json(str(row[0])) for _, row in self._rows(RANGE, args))
        ordered = sorted(found, key=lambda r: (r.time, r.record_id))
        return ordered if limit is None else ordered[:limit]

    def places(
        self, since: str, until: str, tenant: str | None, after: After | None, limit: int
    ) -> list[tuple[After, UsageRecord]]:
        """A page of ``page``'s range, each record with its place (what a next page
        starts after): a journal's in each shard's append order (the shards merged by
        time), the ledger's in (time, record id) order."""
        if self.dsn is not None:
            found = self.page(since, until, tenant, after, limit)
            return [((r.time.isoformat(), r.record_id), r) for r in found]
        marks = read_marks(after[1]) if after is not None and not after[0] else {}
        with contextlib.ExitStack() as held:
            streams = []
            for k, path in self._shards():
                args = (since, until, tenant, tenant, marks.get(k, 0), limit)
                rows = _cursor(held, path, APPENDED, args)
                if rows is not None:
                    streams.append(_appended(k, rows))
            return _page(streams, marks, limit)

    def record(self, record_id: str) -> UsageRecord | None:
        """The record with this id (None: no such record)."""
        found = self.located(record_id)
        return found[0] if found is not None else None

    def located(self, record_id: str) -> tuple[UsageRecord, dict[str, str]] | None:
        """The record with this id and the source it was read from (``describe``'s
        words); one the ledger does not have yet (the outbox delivers later) is read
        from this replica's journal, and said to be."""
        record_id = _canonical(record_id)
        if self.dsn is not None and _is_uuid(record_id):
            from proxy.ledger.sinks.postgres import read_record

            found = asyncio.run(read_record(self.dsn, record_id))
            if found is not None:
                return found, dict(LEDGER)
        query = "SELECT body FROM records WHERE kind = 'usage' AND record_id = ?"
        for _, (body,) in self._rows(query, (record_id,)):
            return UsageRecord.from_json(str(body)), dict(JOURNAL)
        return None

    def _rows(self, query: str, args: tuple[object, ...]) -> Iterator[tuple[int, Row]]:
        """Every shard's rows of ``query``, each with its shard's index."""
        for k, rows in self._shard_rows(query, lambda k: args):
            yield from ((k, row) for row in rows)

    def _shard_rows(
        self, query: str, args: Callable[[int], tuple[object, ...]]
    ) -> list[tuple[int, list[Row]]]:
        return [(k, _shard(path, query, args(k))) for k, path in self._shards()]

    def _shards(self) -> list[tuple[int, Path]]:
        return numbered(self.journal) if self.journal is not None else []


Row = tuple[object, ...]
Appended = tuple[str, int, int, str]  # a journal row's time, shard, seq and body


def _page(
    streams: list[Iterator[Appended]], marks: Marks, limit: int
) -> list[tuple[After, UsageRecord]]:
    """At most ``limit`` records of the shards' ``streams``, each with its place.
    heapq.merge takes each stream's rows in their order (lazily: a shard's rows are
    read as the page needs them): a page is a prefix of each shard's appends, whatever
    the times, so each shard's mark is exact."""
    taken: list[tuple[After, UsageRecord]] = []
    seen: set[str] = set()
    for _, k, seq, body in heapq.merge(*streams, key=lambda row: row[0]):
        if len(taken) == limit:
            break
        marks[k] = seq
        record = UsageRecord.from_json(body)
        if record.record_id not in seen:  # ids are uuid7: one in two shards is a bug
            seen.add(record.record_id)
            taken.append((("", marks_text(marks)), record))
    return taken


def _appended(k: int, rows: Iterator[Row]) -> Iterator[Appended]:
    for seq, time, body in rows:
        yield str(time), k, int(str(seq)), str(body)


def _cursor(
    held: contextlib.ExitStack, path: Path, query: str, args: tuple[object, ...]
) -> Iterator[Row] | None:
    """One shard's rows of ``query``, read as they are asked for, the shard held open
    by ``held``; None when it is gone or not yet given its schema."""
    try:
        db = open_existing(path, writable=False)
    except FileNotFoundError:
        return None
    held.callback(db.close)
    try:
        return iter(db.execute(query, args))
    except sqlite3.OperationalError:
        return None


def _shard(path: Path, query: str, args: tuple[object, ...]) -> list[Row]:
    """One shard's rows; none when it is gone or not yet given its schema."""
    try:
        db = open_existing(path, writable=False)
    except FileNotFoundError:  # nothing journaled yet
        return []
    try:
        return [tuple(row) for row in db.execute(query, args)]
    except sqlite3.OperationalError:  # a journal not yet given its schema
        return []
    finally:
        db.close()


def _once(records: Iterator[UsageRecord]) -> list[UsageRecord]:
    """Each record once (ids are uuid7: one in two shards is a bug, never two records)."""
    found: dict[str, UsageRecord] = {}
    for record in records:
        found.setdefault(record.record_id, record)
    return list(found.values())


def marks_text(marks: Marks) -> str:
    """A journal's place as a cursor holds it: ``k:seq`` per shard read, by index."""
    return ",".join(f"{k}:{seq}" for k, seq in sorted(marks.items()))


def read_marks(text: str) -> Marks:
    """``marks_text``'s inverse (a bare seq, a cursor of one journal, is shard 0's);
    ``ValueError`` for anything else."""
    if text.isdigit():
        return {0: int(text)}
    marks: Marks = {}
    for part in text.split(","):
        k, sep, seq = part.partition(":")
        if not (sep and k.isdigit() and seq.isdigit()) or int(k) in marks:
            raise ValueError(f"not a journal's place: {text!r}")
        marks[int(k)] = int(seq)
    return marks


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
