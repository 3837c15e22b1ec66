"""The durable local usage journal: SQLite in WAL mode, group commit, and an outbox.

All SQLite work runs on one dedicated thread. ``append`` hands a record to that thread;
whatever is pending when the thread gets to it is committed in one transaction (group
commit), and one callback on the event loop settles the whole group. In ``sync``
durability each caller returns only after its record is on disk. In ``async`` durability
the caller returns at once and the thread commits at most once per ``commit_interval``,
so a steady stream of requests costs one commit (and one thread wake-up) per interval
instead of one per record. Exporters read batches past their own cursor and advance it
after delivery (at-least-once; record ids make redelivery idempotent).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import structlog

from proxy.ledger.sqlite import (
    GROUP_MAX,
    Row,
    SqliteThread,
    UsageSum,
    as_row,
    create_schema,
    exporter_backlogs,
    insert_sql,
    transaction,
    usage_sums,
)
from proxy.ledger.windows import Entry, parse_entry

log = structlog.get_logger("proxy.ledger.journal")

T = TypeVar("T")
# The future answers a sync appender; async appenders have none.
_Item = tuple[Row, "asyncio.Future[None] | None"]


class JournalError(Exception):
    """A record could not be journaled (disk full, I/O error, closed journal)."""


class Journal:
    """SQLite journal with group commit; owns its thread and its writer task."""

    def __init__(
        self,
        path: Path,
        *,
        sync: bool = True,
        commit_timeout: float = 2.0,
        commit_interval: float = 0.0,
        on_replaced: Callable[[int], None] | None = None,
        on_health: Callable[[bool], None] | None = None,
    ) -> None:
        self.path = path
        self.sync = sync
        self.commit_timeout = commit_timeout
        self.commit_interval = commit_interval
        self._on_replaced = on_replaced
        # Told each change of ``healthy`` (the serving side sets its gauge from it), on
        # the event loop: a metric set where health changes, not read by a callback at
        # scrape time, which a multiprocess metrics directory could not hold.
        self._on_health = on_health
        self._thread = SqliteThread()
        self._db: sqlite3.Connection | None = None
        self._identity: tuple[int, int] | None = None
        # False from a failed or stalled commit until the next successful one.
        self.healthy = True
        self.problem: str | None = None
        # Records handed to the thread and not yet committed; ``_draining`` is True while
        # a drain job is queued or running on the thread (both guarded by ``_lock``).
        self._pending: list[_Item] = []
        self._draining = False
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._accepting = False
        self.committed = asyncio.Event()
        self.appended = 0
        self.failed = 0

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._thread.run(fn, *args)

    async def open(self) -> None:
        self._thread.start()
        await self._run(self._open)
        self._loop = asyncio.get_running_loop()
        self._accepting = True

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        create_schema(db)
        self._db = db
        stat = os.stat(self.path)
        self._identity = (stat.st_dev, stat.st_ino)

    def _check_file(self) -> None:
        """Recreate the journal if its file was deleted or replaced while open.

        Writes would otherwise go to an unlinked inode and vanish at the next restart. The
        records the old file still holds are carried over, so nothing is lost.
        """
        try:
            stat = os.stat(self.path)
            if (stat.st_dev, stat.st_ino) == self._identity:
                return
        except FileNotFoundError:
            pass
        assert self._db is not None
        old = self._db
        records = old.execute(
            "SELECT seq, record_id, time, tenant, body, kind FROM records"
        ).fetchall()
        cursors = old.execute("SELECT sink, seq FROM cursors").fetchall()
        old.close()
        self._open()
        assert self._db is not None
        with transaction(self._db):
            self._db.executemany(
                "INSERT OR IGNORE INTO records(seq, record_id, time, tenant, body, kind) "
                "VALUES (?,?,?,?,?,?)",
                records,
            )
            self._db.executemany("INSERT OR REPLACE INTO cursors VALUES (?,?)", cursors)
        log.error("journal_file_replaced", path=str(self.path), carried_over=len(records))
        if self._on_replaced is not None:
            self._on_replaced(len(records))

    async def append(self, record: Entry) -> None:
        """Journal one record; in sync durability, return once it is committed.

        A commit that takes longer than ``commit_timeout`` (a frozen or hung disk) raises
        JournalError and marks the journal unhealthy; the record stays queued and is
        committed if the disk comes back.
        """
        if not self._accepting:
            raise JournalError("journal is not open")
        loop = asyncio.get_running_loop()
        future = loop.create_future() if self.sync else None
        row = as_row(record)
        with self._lock:
            self._pending.append((row, future))
            start, self._draining = not self._draining, True
        if start:
            self._thread.post(self._drain)
        if future is None:
            return
        # On timeout the future fails, not the write: the record stays pending and settling
        # skips futures that are already done. A timer on the future, not asyncio.timeout:
        # this wait is paid once per audited request, and the timer costs a fifth of it.
        expiry = loop.call_later(self.commit_timeout, _expire, future)
        try:
            await future
        except TimeoutError:
            self._unhealthy(f"commit took longer than {self.commit_timeout} s")
            raise JournalError(f"commit took longer than {self.commit_timeout} s") from None
        finally:
            expiry.cancel()

    def _unhealthy(self, problem: str) -> None:
        self._health(problem)

    def _health(self, problem: str | None) -> None:
        """Healthy when ``problem`` is None; the callback hears changes only (a commit
        of a healthy journal, once per group, tells it nothing)."""
        changed = self.healthy != (problem is None)
        self.healthy, self.problem = problem is None, problem
        if changed and self._on_health is not None:
            self._on_health(self.healthy)

    async def probe(self) -> bool:
        """One small write through the writer thread, bounded: can records be journaled?"""
        if not self._accepting:
            return False
        try:
            async with asyncio.timeout(self.commit_timeout):
                await self._run(self._heartbeat)
        except TimeoutError:
            self._unhealthy(f"a test write took longer than {self.commit_timeout} s")
        except Exception as exc:
            self._unhealthy(f"a test write failed: {exc}")
        else:
            self._health(None)
        return self.healthy

    def _heartbeat(self) -> None:
        assert self._db is not None
        self._check_file()
        with transaction(self._db):
            self._db.execute("INSERT OR REPLACE INTO heartbeat VALUES (1, datetime('now'))")

    def _drain(self) -> None:
        """On the journal thread: commit what is pending, group by group, until nothing
        is; each group is settled on the event loop by one callback.

        Whether more is pending is decided before that callback is scheduled, so the
        thread goes back to waiting (releasing the GIL) right after it: the event loop,
        woken by the callback, then rarely has to wait for the GIL.

        In async durability the thread first lets ``commit_interval`` pass, so that the
        records of that interval share one commit."""
        assert self._loop is not None
        if not self.sync and self.commit_interval > 0:
            time.sleep(self.commit_interval)
        with self._lock:
            group = self._take()
        while group:
            error: Exception | None = None
            try:
                self._insert([row for row, _ in group])
            except Exception as exc:
                error = exc
            with self._lock:
                following = self._take()
            self._loop.call_soon_threadsafe(self._settle, group, error)
            group = following

    def _take(self) -> list[_Item]:
        """The next group to commit (lock held); none left ends the drain."""
        group = self._pending[:GROUP_MAX]
        del self._pending[:GROUP_MAX]
        if not group:
            self._draining = False
        return group

    def _settle(self, group: list[_Item], error: Exception | None) -> None:
        """On the event loop: answer the appenders of one committed (or failed) group."""
        if error is not None:
            self.failed += len(group)
            self._unhealthy(f"write failed: {error}")
            log.error("journal_write_failed", error=str(error), records=len(group))
            for _, future in group:
                if future is not None and not future.done():
                    future.set_exception(JournalError(str(error)))
            return
        self.appended += len(group)
        self._health(None)
        for _, future in group:
            if future is not None and not future.done():
                future.set_result(None)
        self.committed.set()

    def _insert(self, rows: list[Row]) -> None:
        assert self._db is not None
        self._check_file()
        self._db.execute(insert_sql(len(rows)), [value for row in rows for value in row])

    async def batch(self, sink: str, limit: int) -> list[tuple[int, Entry]]:
        """Up to ``limit`` entries the sink has not acknowledged, oldest first."""
        rows = await self._run(self._batch, sink, limit)
        return [(seq, parse_entry(body)) for seq, body in rows]

    def _batch(self, sink: str, limit: int) -> list[tuple[int, str]]:
        assert self._db is not None
        cursor = self._cursor(sink)
        query = "SELECT seq, body FROM records WHERE seq > ? ORDER BY seq LIMIT ?"
        return list(self._db.execute(query, (cursor, limit)))

    def _cursor(self, sink: str) -> int:
        assert self._db is not None
        row = self._db.execute("SELECT seq FROM cursors WHERE sink = ?", (sink,)).fetchone()
        return int(row[0]) if row else 0

    async def ack(self, sink: str, seq: int) -> None:
        """The sink has every record up to ``seq``."""
        await self._run(self._ack, sink, seq)

    def _ack(self, sink: str, seq: int) -> None:
        assert self._db is not None
        with transaction(self._db):
            self._db.execute(
                "INSERT INTO cursors(sink, seq) VALUES (?, ?) "
                "ON CONFLICT(sink) DO UPDATE SET seq = max(seq, excluded.seq)",
                (sink, seq),
            )

    async def dead_letter(self, sink: str, record: Entry, error: str) -> None:
        """Keep a record the sink rejected permanently; it no longer blocks the sink."""
        await self._run(self._dead_letter, sink, record.record_id, record.to_json(), error)

    def _dead_letter(self, sink: str, record_id: str, body: str, error: str) -> None:
        assert self._db is not None
        with transaction(self._db):
            self._db.execute(
                "INSERT INTO dead_letters(sink, record_id, body, error, at) "
                "VALUES (?,?,?,?,datetime('now')) ON CONFLICT(sink, record_id) DO UPDATE SET "
                "error = excluded.error, at = excluded.at, attempts = attempts + 1, requeued = 0",
                (sink, record_id, body, error[:2000]),
            )

    async def requeued(self, sink: str, limit: int) -> list[Entry]:
        """Dead letters of ``sink`` that an operator asked to replay."""
        rows = await self._run(self._requeued, sink, limit)
        return [parse_entry(body) for body in rows]

    def _requeued(self, sink: str, limit: int) -> list[str]:
        assert self._db is not None
        query = "SELECT body FROM dead_letters WHERE sink = ? AND requeued = 1 LIMIT ?"
        return [str(b) for (b,) in self._db.execute(query, (sink, limit))]

    async def revive(self, sink: str, record_ids: list[str]) -> None:
        """Replayed dead letters the sink has now accepted."""
        await self._run(self._revive, sink, record_ids)

    def _revive(self, sink: str, record_ids: list[str]) -> None:
        assert self._db is not None
        with transaction(self._db):
            self._db.executemany(
                "DELETE FROM dead_letters WHERE sink = ? AND record_id = ?",
                [(sink, r) for r in record_ids],
            )

    async def dead_count(self, sink: str) -> int:
        return await self._run(self._dead_count, sink)

    def _dead_count(self, sink: str) -> int:
        assert self._db is not None
        row = self._db.execute("SELECT count(*) FROM dead_letters WHERE sink = ?", (sink,))
        return int(row.fetchone()[0])

    async def register(self, sinks: list[str]) -> None:
        """Remember every exporter configured now: the journal keeps each record until
        every exporter it has ever had holds it (a restart without one of them does not
        prune what it never received), unless an operator discards that exporter."""
        await self._run(self._register, sinks)

    def _register(self, sinks: list[str]) -> None:
        assert self._db is not None
        with transaction(self._db):
            self._db.executemany(
                "INSERT OR IGNORE INTO cursors(sink, seq) VALUES (?, 0)", [(s,) for s in sinks]
            )

    async def exporters(self) -> dict[str, int]:
        """Every exporter the journal remembers, with its backlog (records not delivered)."""
        return await self._run(self._exporters)

    def _exporters(self) -> dict[str, int]:
        assert self._db is not None
        return exporter_backlogs(self._db)

    async def prune(self, before: str) -> int:
        """Delete records older than ``before`` (ISO, UTC) that every exporter the journal
        remembers has acknowledged.

        Freed pages are reused by SQLite, so a journal with working exporters stays flat.
        """
        return await self._run(self._prune, before)

    def _prune(self, before: str) -> int:
        assert self._db is not None
        row = self._db.execute("SELECT min(seq), count(*) FROM cursors").fetchone()
        if not row[1]:
            return 0
        with transaction(self._db):
            cursor = self._db.execute(
                "DELETE FROM records WHERE seq <= ? AND time < ?", (int(row[0]), before)
            )
        return int(cursor.rowcount)

    async def backlog(self, sink: str) -> int:
        return await self._run(self._backlog, sink)

    def _backlog(self, sink: str) -> int:
        assert self._db is not None
        cursor = self._cursor(sink)
        row = self._db.execute("SELECT count(*) FROM records WHERE seq > ?", (cursor,))
        return int(row.fetchone()[0])

    async def claim_response(self, response_id: str, tenant: str) -> None:
        """Remember, durably, that ``tenant`` made the stored response ``response_id`` (the
        first claim stands: an id is never handed to a second tenant)."""
        await self._bounded(self._claim_response, response_id, tenant)

    def _claim_response(self, response_id: str, tenant: str) -> None:
        assert self._db is not None
        self._db.execute(
            "INSERT OR IGNORE INTO response_owners (response_id, tenant, at) "
            "VALUES (?, ?, datetime('now'))",
            (response_id, tenant),
        )

    async def response_owner(self, response_id: str) -> str | None:
        """The tenant that made the stored response ``response_id`` (None: none known)."""
        return await self._bounded(self._response_owner, response_id)

    async def _bounded(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the thread, within ``commit_timeout`` (a frozen disk holds the
        thread); JournalError when the journal is closed or the time is up."""
        if not self._accepting:
            raise JournalError("journal is not open")
        try:
            async with asyncio.timeout(self.commit_timeout):
                return await self._run(fn, *args)
        except TimeoutError:
            raise JournalError(f"no answer within {self.commit_timeout} s") from None

    def _response_owner(self, response_id: str) -> str | None:
        assert self._db is not None
        row = self._db.execute(
            "SELECT tenant FROM response_owners WHERE response_id = ?", (response_id,)
        ).fetchone()
        return None if row is None else str(row[0])

    async def usage_since(
        self, since: datetime, bucket: int, cuts: Sequence[datetime] = ()
    ) -> list[UsageSum]:
        """Billed usage journaled at or after ``since``, summed by tenant, model, key and
        ``bucket``-second interval, split at each of ``cuts`` (the instants prices change:
        no sum spans two prices); read-only: budgets are rebuilt from it at start."""
        after = since.astimezone(UTC).isoformat()
        at = [cut.astimezone(UTC).isoformat() for cut in cuts]
        return await self._run(self._usage_since, after, bucket, at)

    def _usage_since(self, since: str, bucket: int, cuts: list[str]) -> list[UsageSum]:
        assert self._db is not None
        return usage_sums(self._db, since, bucket, cuts)

    async def close(self) -> None:
        """Commit what is pending, then close the database (appends fail from now)."""
        self._accepting = False
        if self._db is not None:
            # The thread runs jobs in order: every drain has run before this close, and
            # their settle callbacks are scheduled ahead of this await's wake-up.
            await self._run(self._db.close)
        self._thread.stop()


def _expire(future: asyncio.Future[None]) -> None:
    """A sync append's commit timed out: its wait ends (the write goes on)."""
    if not future.done():
        future.set_exception(TimeoutError())
