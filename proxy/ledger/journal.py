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
import contextlib
import functools
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import structlog

from proxy.ledger.records import UsageRecord
from proxy.ledger.windows import Entry, parse_entry

log = structlog.get_logger("proxy.ledger.journal")
T = TypeVar("T")
_Row = tuple[str, str, str, str, str]  # record_id, time, tenant, body, kind
# The future answers a sync appender; async appenders have none.
_Item = tuple[_Row, "asyncio.Future[None] | None"]
# A group is committed by one multi-row INSERT in autocommit mode: one statement is one
# transaction (one fsync) and one call into SQLite, where BEGIN, executemany and COMMIT
# were three, each a hand-off of the GIL with the event loop. SQLite before 3.32 allows
# 999 parameters in one statement: 199 rows of 5.
_GROUP_MAX = 999 // 5

SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    record_id TEXT NOT NULL UNIQUE,
    time TEXT NOT NULL,
    tenant TEXT NOT NULL,
    body TEXT NOT NULL,
    kind TEXT NOT NULL DEFAULT 'usage'
);
CREATE INDEX IF NOT EXISTS records_time ON records(time);
CREATE TABLE IF NOT EXISTS cursors (sink TEXT PRIMARY KEY, seq INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS heartbeat (id INTEGER PRIMARY KEY CHECK (id = 1), at TEXT);
CREATE TABLE IF NOT EXISTS dead_letters (
    sink TEXT NOT NULL,
    record_id TEXT NOT NULL,
    body TEXT NOT NULL,
    error TEXT NOT NULL,
    at TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 1,
    requeued INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (sink, record_id)
);
"""


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
    ) -> None:
        self.path = path
        self.sync = sync
        self.commit_timeout = commit_timeout
        self.commit_interval = commit_interval
        self._on_replaced = on_replaced
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
        _create(db)
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
        with _transaction(self._db):
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
        future = asyncio.get_running_loop().create_future() if self.sync else None
        row = as_row(record)
        with self._lock:
            self._pending.append((row, future))
            start, self._draining = not self._draining, True
        if start:
            self._thread.post(self._drain)
        if future is None:
            return
        try:
            # On timeout the future is cancelled, not the write: the record stays pending
            # and settling skips futures that are already done.
            async with asyncio.timeout(self.commit_timeout):
                await future
        except TimeoutError:
            self._unhealthy(f"commit took longer than {self.commit_timeout} s")
            raise JournalError(f"commit took longer than {self.commit_timeout} s") from None

    def _unhealthy(self, problem: str) -> None:
        self.healthy, self.problem = False, problem

    async def probe(self) -> bool:
        """One small write through the writer thread, bounded: can records be journaled?"""
        if not self._accepting:
            return False
        try:
            await asyncio.wait_for(self._run(self._heartbeat), self.commit_timeout)
        except TimeoutError:
            self._unhealthy(f"a test write took longer than {self.commit_timeout} s")
        except Exception as exc:
            self._unhealthy(f"a test write failed: {exc}")
        else:
            self.healthy, self.problem = True, None
        return self.healthy

    def _heartbeat(self) -> None:
        assert self._db is not None
        self._check_file()
        with _transaction(self._db):
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
        group = self._pending[:_GROUP_MAX]
        del self._pending[:_GROUP_MAX]
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
        self.healthy, self.problem = True, None
        for _, future in group:
            if future is not None and not future.done():
                future.set_result(None)
        self.committed.set()

    def _insert(self, rows: list[_Row]) -> None:
        assert self._db is not None
        self._check_file()
        self._db.execute(_insert_sql(len(rows)), [value for row in rows for value in row])

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
        with _transaction(self._db):
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
        with _transaction(self._db):
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
        with _transaction(self._db):
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

    async def prune(self, before: str, sinks: list[str]) -> int:
        """Delete records older than ``before`` (ISO) that every sink has acknowledged.

        Freed pages are reused by SQLite, so a journal with working exporters stays flat.
        """
        if not sinks:
            return 0
        return await self._run(self._prune, before, sinks)

    def _prune(self, before: str, sinks: list[str]) -> int:
        assert self._db is not None
        delivered = min(self._cursor(s) for s in sinks)
        with _transaction(self._db):
            cursor = self._db.execute(
                "DELETE FROM records WHERE seq <= ? AND time < ?", (delivered, before)
            )
        return int(cursor.rowcount)

    async def backlog(self, sink: str) -> int:
        return await self._run(self._backlog, sink)

    def _backlog(self, sink: str) -> int:
        assert self._db is not None
        cursor = self._cursor(sink)
        row = self._db.execute("SELECT count(*) FROM records WHERE seq > ?", (cursor,))
        return int(row.fetchone()[0])

    async def close(self) -> None:
        """Commit what is pending, then close the database (appends fail from now)."""
        self._accepting = False
        if self._db is not None:
            # The thread runs jobs in order: every drain has run before this close, and
            # their settle callbacks are scheduled ahead of this await's wake-up.
            await self._run(self._db.close)
        self._thread.stop()


class SqliteThread:
    """The journal's one thread: runs SQLite jobs in the order they are handed over.

    Handing a job over is a queue put (about 0.05 us), where an executor's ``submit``
    builds a future and a work item and checks its threads (about 19 us here); that is
    paid once per audited request. Daemon: an interpreter that exits without closing the
    journal does not wait for it (SQLite transactions are atomic either way).
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="journal", daemon=True)
            self._thread.start()

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            job()

    def post(self, job: Callable[[], None]) -> None:
        """Run ``job`` on the thread; it reports its own outcome."""
        self._jobs.put(job)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the thread; its result or exception, back on the event loop.
        A caller that stops waiting (a timeout) does not stop the job."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def job() -> None:
            try:
                result = fn(*args)
            except BaseException as exc:  # handed to the awaiting caller
                loop.call_soon_threadsafe(_reject, future, exc)
            else:
                loop.call_soon_threadsafe(_resolve, future, result)

        self._jobs.put(job)
        return await future

    def stop(self) -> None:
        """Finish the jobs handed over so far, then end the thread (blocking)."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None


def _resolve(future: asyncio.Future[T], result: T) -> None:
    if not future.done():
        future.set_result(result)


def _reject(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


@contextlib.contextmanager
def _transaction(db: sqlite3.Connection) -> Any:
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if db.in_transaction:  # SQLite already rolled back on e.g. SQLITE_FULL
            db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


@functools.lru_cache(maxsize=_GROUP_MAX)
def _insert_sql(rows: int) -> str:
    """``INSERT OR IGNORE`` of ``rows`` records in one statement."""
    values = ",".join(["(?,?,?,?,?)"] * rows)
    return f"INSERT OR IGNORE INTO records(record_id, time, tenant, body, kind) VALUES {values}"


@dataclass(frozen=True, slots=True)
class DeadLetter:
    sink: str
    record_id: str
    error: str
    at: str
    attempts: int
    requeued: bool
    body: str


def list_dead_letters(path: Path, sink: str | None = None) -> list[DeadLetter]:
    """Dead letters straight from a journal file (``usage-proxy dead-letters list``)."""
    db = _open_existing(path, writable=False)
    try:
        if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'dead_letters'").fetchone():
            return []
        query = (
            "SELECT sink, record_id, error, at, attempts, requeued, body FROM dead_letters "
            "WHERE ? IS NULL OR sink = ? ORDER BY at"
        )
        return [
            DeadLetter(s, r, e, a, int(n), bool(q), b)
            for s, r, e, a, n, q, b in db.execute(query, (sink, sink))
        ]
    finally:
        db.close()


def requeue_dead_letters(path: Path, sink: str | None = None) -> int:
    """Mark dead letters for replay; the running (or next) proxy delivers them again."""
    db = _open_existing(path, writable=True)
    try:
        db.execute("PRAGMA busy_timeout = 5000")
        with db:
            cursor = db.execute(
                "UPDATE dead_letters SET requeued = 1 WHERE ? IS NULL OR sink = ?", (sink, sink)
            )
        return int(cursor.rowcount)
    finally:
        db.close()


def _open_existing(path: Path, *, writable: bool) -> sqlite3.Connection:
    if not path.exists():
        raise FileNotFoundError(f"no journal at {path}")
    db = sqlite3.connect(f"file:{path}?mode={'rw' if writable else 'ro'}", uri=True)
    if writable:
        _create(db)
    return db


def read_journal(
    path: Path, since: str | None = None, until: str | None = None, kind: str = "usage"
) -> list[str]:
    """Entry bodies of one kind (``usage`` records or ``reconciliation`` windows) straight
    from a journal file, for ``usage-proxy report`` and ``usage-proxy reconcile``."""
    db = _open_existing(path, writable=False)
    try:
        columns = {row[1] for row in db.execute("PRAGMA table_info(records)")}
        if "kind" not in columns:  # a journal from before reconciliation: usage only
            if kind != "usage":
                return []
            query = "SELECT body FROM records WHERE time >= ? AND time < ? ORDER BY seq"
            return [str(b) for (b,) in db.execute(query, (since or "", until or "\uffff"))]
        query = "SELECT body FROM records WHERE time >= ? AND time < ? AND kind = ? ORDER BY seq"
        return [str(b) for (b,) in db.execute(query, (since or "", until or "\uffff", kind))]
    finally:
        db.close()


def _create(db: sqlite3.Connection) -> None:
    """The schema; a journal made before entries had a kind gets the column (usage)."""
    db.executescript(SCHEMA)
    columns = {row[1] for row in db.execute("PRAGMA table_info(records)")}
    if "kind" not in columns:
        db.execute("ALTER TABLE records ADD COLUMN kind TEXT NOT NULL DEFAULT 'usage'")


def as_row(entry: Entry) -> _Row:
    """The ``records`` columns of one entry, in ``_insert_sql`` order."""
    return (entry.record_id, entry.time.isoformat(), entry.tenant, entry.to_json(), _kind(entry))


def _kind(entry: Entry) -> str:
    return "usage" if isinstance(entry, UsageRecord) else "reconciliation"
