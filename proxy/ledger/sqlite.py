"""The journal's SQLite file: its schema, its rows, the usage sums budgets are rebuilt from,
and the one thread that runs its work.

All SQLite work of a running proxy happens on that thread (``SqliteThread``); the
functions here are what it runs, and what the offline commands open the file with.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import queue
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from proxy.accounting.units import Unit
from proxy.ledger.records import UsageRecord
from proxy.ledger.windows import Entry

T = TypeVar("T")
Row = tuple[str, str, str, str, str]  # record_id, time, tenant, body, kind
# A group is committed by one multi-row INSERT in autocommit mode: one statement is one
# transaction (one fsync) and one call into SQLite, where BEGIN, executemany and COMMIT
# were three, each a hand-off of the GIL with the event loop. SQLite before 3.32 allows
# 999 parameters in one statement: 199 rows of 5.
GROUP_MAX = 999 // 5

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
CREATE TABLE IF NOT EXISTS response_owners (
    response_id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    at TEXT NOT NULL
);
"""


class SqliteThread:
    """The journal's one thread: runs SQLite jobs in the order they are handed over.

    Handing a job over is a queue put, where an executor's ``submit`` builds a future and
    a work item and checks its threads, and it is paid once per audited request. Daemon:
    an interpreter that exits without closing the journal does not wait for it (SQLite
    transactions are atomic either way).
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
def transaction(db: sqlite3.Connection) -> Any:
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if db.in_transaction:  # SQLite already rolled back on e.g. SQLITE_FULL
            db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


@functools.lru_cache(maxsize=GROUP_MAX)
def insert_sql(rows: int) -> str:
    """``INSERT OR IGNORE`` of ``rows`` records in one statement."""
    values = ",".join(["(?,?,?,?,?)"] * rows)
    return f"INSERT OR IGNORE INTO records(record_id, time, tenant, body, kind) VALUES {values}"


def create_schema(db: sqlite3.Connection) -> None:
    """The schema; a journal made before entries had a kind gets the column (usage)."""
    db.executescript(SCHEMA)
    columns = {row[1] for row in db.execute("PRAGMA table_info(records)")}
    if "kind" not in columns:
        db.execute("ALTER TABLE records ADD COLUMN kind TEXT NOT NULL DEFAULT 'usage'")


def as_row(entry: Entry) -> Row:
    """The ``records`` columns of one entry, in ``insert_sql`` order."""
    return (entry.record_id, entry.time.isoformat(), entry.tenant, entry.to_json(), _kind(entry))


def _kind(entry: Entry) -> str:
    return "usage" if isinstance(entry, UsageRecord) else "reconciliation"


def open_existing(path: Path, *, writable: bool) -> sqlite3.Connection:
    """A journal file that must already exist (the offline commands never create one)."""
    if not path.exists():
        raise FileNotFoundError(f"no journal at {path}")
    db = sqlite3.connect(f"file:{path}?mode={'rw' if writable else 'ro'}", uri=True)
    if writable:
        create_schema(db)
    return db


def exporter_backlogs(db: sqlite3.Connection) -> dict[str, int]:
    """Each exporter the journal remembers, with the records it has not acknowledged."""
    rows = db.execute(
        "SELECT c.sink, (SELECT count(*) FROM records r WHERE r.seq > c.seq) "
        "FROM cursors c ORDER BY c.sink"
    )
    return {str(sink): int(backlog) for sink, backlog in rows}


# Times are stored as UTC ISO strings, so they compare as text and index as such.
USAGE_SUMS = f"""
SELECT tenant, json_extract(body, '$.model'), json_extract(body, '$.key_hash'),
       (CAST(strftime('%s', substr(time, 1, 19)) AS INTEGER) / ?) * ? AS bucket,
       sum(coalesce(json_extract(body, '$.prompt_tokens_billed'), 0)),
       sum(coalesce(json_extract(body, '$.completion_tokens_billed'), 0)),
       count(*),
       sum(coalesce(json_extract(body, '$.units.{Unit.CACHED}'), 0)),
       sum(coalesce(json_extract(body, '$.units.{Unit.AUDIO}'), 0)),
       {{segment}} AS segment
FROM records WHERE kind = 'usage' AND time >= ?
GROUP BY 1, 2, 3, 4, 10
"""


@dataclass(frozen=True, slots=True)
class UsageSum:
    """Billed usage of one tenant, model and key in one interval, from the journal."""

    tenant: str
    model: str | None
    key_hash: str | None
    start: int  # Unix seconds
    prompt: int
    completion: int
    records: int
    cached: int = 0  # cached prompt tokens (part of ``prompt``)
    audio: int = 0  # audio seconds
    segment: int = 0  # how many of the ``cuts`` asked for are at or before these records


def usage_sums(db: sqlite3.Connection, since: str, bucket: int, cuts: list[str]) -> list[UsageSum]:
    """The billed usage journaled at or after ``since`` (UTC ISO, compared as text as the
    times are), summed per tenant, model, key and ``bucket``-second interval, split at
    each of ``cuts``."""
    segment = " + ".join(["(time >= ?)"] * len(cuts)) or "0"
    rows = db.execute(USAGE_SUMS.format(segment=segment), (bucket, bucket, *cuts, since))
    return [UsageSum(*row) for row in rows]
