"""A journal read (and its dead letters requeued) offline, by the ``usage-proxy``
commands, while a proxy may be running on it: the file at ``--journal`` and every worker's
shard beside it (``proxy.ledger.shards``), the pod's records once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import structlog

from proxy.ledger.shards import shards
from proxy.ledger.sqlite import exporter_backlogs, open_existing

log = structlog.get_logger("proxy.ledger.journal_files")


@dataclass(frozen=True, slots=True)
class DeadLetter:
    sink: str
    record_id: str
    error: str
    at: str
    attempts: int
    requeued: bool
    body: str


def files(journal: Path) -> list[Path]:
    """The files the offline commands read for ``journal``: every shard; the plain path
    when none exists, so that opening it says there is no journal there."""
    return shards(journal) or [journal]


def list_dead_letters(path: Path, sink: str | None = None) -> list[DeadLetter]:
    """Dead letters straight from a journal's shards (``usage-proxy dead-letters list``)."""
    letters = [d for shard in files(path) for d in _dead_letters(shard, sink)]
    return sorted(letters, key=lambda d: d.at)


def _dead_letters(path: Path, sink: str | None) -> list[DeadLetter]:
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
    """Mark dead letters for replay in every shard; the running (or next) proxy delivers
    them again. The number marked, all shards together."""
    return sum(_requeue(shard, sink) for shard in files(path))


def _requeue(path: Path, sink: str | None) -> int:
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
    from a journal's shards, for ``usage-proxy report`` and ``usage-proxy reconcile``: one
    shard's in append order; several shards' by time, each record once."""
    found = files(path)
    if len(found) == 1:
        return [body for _, _, body in _entries(found[0], since, until, kind)]
    seen: set[str] = set()
    rows = []
    for shard in found:
        for time, record_id, body in _entries(shard, since, until, kind):
            if record_id in seen:  # ids are uuid7: a duplicate is a bug, never a record
                log.error("duplicate_record_across_shards", record_id=record_id, shard=str(shard))
                continue
            seen.add(record_id)
            rows.append((time, body))
    return [body for _, body in sorted(rows, key=lambda row: row[0])]


def _entries(
    path: Path, since: str | None, until: str | None, kind: str
) -> list[tuple[str, str, str]]:
    """``(time, record_id, body)`` of one file's entries of ``kind`` in the range."""
    db = open_existing(path, writable=False)
    try:
        columns = {row[1] for row in db.execute("PRAGMA table_info(records)")}
        bounds = (since or "", until or "\uffff")
        select = "SELECT time, record_id, body FROM records WHERE time >= ? AND time < ?"
        if "kind" not in columns:  # a journal from before reconciliation: usage only
            if kind != "usage":
                return []
            rows = db.execute(select + " ORDER BY seq", bounds)
        else:
            rows = db.execute(select + " AND kind = ? ORDER BY seq", (*bounds, kind))
        return [(str(t), str(r), str(b)) for t, r, b in rows]
    finally:
        db.close()


def list_exporters(path: Path) -> dict[str, int]:
    """Every exporter a journal's shards remember, with its backlog summed over them
    (``usage-proxy exporters``)."""
    total: dict[str, int] = {}
    for shard in files(path):
        for sink, backlog in _exporters(shard).items():
            total[sink] = total.get(sink, 0) + backlog
    return dict(sorted(total.items()))


def _exporters(path: Path) -> dict[str, int]:
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
    the other exporters have them. A proxy configured with it again starts it afresh.
    Every shard forgets it; the backlog is summed over the shards that had it."""
    dropped = [b for shard in files(path) if (b := _discard(shard, sink)) is not None]
    return sum(dropped) if dropped else None


def _discard(path: Path, sink: str) -> int | None:
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
