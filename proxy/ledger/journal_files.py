"""A journal file read (and its dead letters requeued) offline, by the ``usage-proxy``
commands, while a proxy may be running on it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from proxy.ledger.sqlite import exporter_backlogs, open_existing


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
    db = open_existing(path, writable=False)
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
    db = open_existing(path, writable=True)
    try:
        db.execute("PRAGMA busy_timeout = 5000")
        with db:
            cursor = db.execute(
                "UPDATE dead_letters SET requeued = 1 WHERE ? IS NULL OR sink = ?", (sink, sink)
            )
        return int(cursor.rowcount)
    finally:
        db.close()


def read_journal(
    path: Path, since: str | None = None, until: str | None = None, kind: str = "usage"
) -> list[str]:
    """Entry bodies of one kind (``usage`` records or ``reconciliation`` windows) straight
    from a journal file, for ``usage-proxy report`` and ``usage-proxy reconcile``."""
    db = open_existing(path, writable=False)
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


def list_exporters(path: Path) -> dict[str, int]:
    """Every exporter a journal file remembers, with its backlog (``usage-proxy exporters``)."""
    db = open_existing(path, writable=False)
    try:
        if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'cursors'").fetchone():
            return {}
        return exporter_backlogs(db)
    finally:
        db.close()


def discard_exporter(path: Path, sink: str) -> int | None:
    """Forget an exporter, so its backlog no longer holds records back from retention;
    the records it had not received (returned; None: no such exporter) are pruned once
    the other exporters have them. A proxy configured with it again starts it afresh."""
    db = open_existing(path, writable=True)
    try:
        db.execute("PRAGMA busy_timeout = 5000")
        backlog = exporter_backlogs(db).get(sink)
        if backlog is not None:
            with db:
                db.execute("DELETE FROM cursors WHERE sink = ?", (sink,))
        return backlog
    finally:
        db.close()
