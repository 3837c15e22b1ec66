"""Costs measured inside the bench process, without a server: the accounting's CPU against
the raw tokenizer, and the sync journal commit taken apart."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.harness import minilm_dir, pct
from bench.workload import SCENARIOS

# The proxy and the tests are imported where they are used: HF_HUB_OFFLINE must be set
# before transformers loads, and `--help` should work without them.

# Appends timed after an idle pause, as between requests to a real upstream.
IDLE_APPENDS = 40
IDLE_SECONDS = 0.025


def accounting_cost(repeat: int) -> dict[str, float]:
    """In-process CPU: full recount and query-only derivation vs one raw batched call."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from proxy.accounting.counts import count_request
    from proxy.accounting.types import EngineProfile, Family, Release, Truncation
    from proxy.tokenizers.hf import load_tokenizer

    tok = load_tokenizer(minilm_dir())
    raw = tok._tok
    _, payload = SCENARIOS["rerank 1x64"]
    query, docs = payload["query"], payload["documents"]
    profile = EngineProfile(Family.BI_ENCODER, 256, True, Release("0.29.0"))

    def timed(fn: Callable[[], Any]) -> float:
        fn()
        started = time.process_time()
        for _ in range(repeat):
            fn()
        return (time.process_time() - started) / repeat * 1000

    raw_ms = timed(lambda: raw([query, *docs], add_special_tokens=True))
    full_ms = timed(lambda: count_request(tok, [query], docs, Truncation(), profile))
    query_ms = timed(lambda: tok.lengths([query], max_length=257))
    return {
        "raw_batch_ms": raw_ms,
        "recount_ms": full_ms,
        "derivation_ms": query_ms,
        "recount_ratio": full_ms / raw_ms,
        "derivation_ratio": query_ms / raw_ms,
    }


class _Clock:
    """Wall and CPU time per record since construction, written into ``out`` by name."""

    def __init__(self, out: dict[str, float], records: int) -> None:
        self._out, self._records = out, records
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def stop(self, name: str) -> None:
        self._out[f"{name}_ms"] = (time.perf_counter() - self._wall) / self._records * 1000
        self._out[f"{name}_cpu_ms"] = (time.process_time() - self._cpu) / self._records * 1000


async def _appends(tmp: Path, records: int, out: dict[str, float]) -> None:
    """Sync ``Journal.append`` back to back, then after idle pauses."""
    from proxy.ledger.journal import Journal
    from tests.support.records import make_record

    journal = Journal(tmp / "j.sqlite")
    await journal.open()
    batch = [make_record(i) for i in range(records)]
    clock = _Clock(out, records)
    for record in batch:
        await journal.append(record)
    clock.stop("append")
    idle = []  # as at a real upstream's pace: the writer and the disk idle in between
    for record in [make_record(records + i) for i in range(IDLE_APPENDS)]:
        await asyncio.sleep(IDLE_SECONDS)
        began = time.perf_counter()
        await journal.append(record)
        idle.append(time.perf_counter() - began)
    out["append_after_idle_ms"] = pct(idle, 0.5) * 1000
    await journal.close()


async def _round_trips(records: int, out: dict[str, float]) -> None:
    """The journal's own hand-off to its thread and back, with nothing to do."""
    from proxy.ledger.sqlite import SqliteThread

    thread = SqliteThread()
    thread.start()
    clock = _Clock(out, records)
    for _ in range(records):
        await thread.run(lambda: None)
    clock.stop("round_trip")
    thread.stop()


def _inline(tmp: Path, mode: str, records: int, out: dict[str, float]) -> None:
    """The journal's INSERT committed on this thread with ``synchronous=mode``."""
    from proxy.ledger.sqlite import as_row, create_schema, insert_sql
    from tests.support.records import make_record

    db = sqlite3.connect(tmp / f"{mode}.sqlite", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={mode}")
    create_schema(db)
    rows = [make_record(i) for i in range(records)]
    clock = _Clock(out, records)
    for r in rows:
        db.execute(insert_sql(1), as_row(r))
    clock.stop(f"commit_{mode.lower()}")
    db.close()


def journal_cost(records: int) -> dict[str, float]:
    """The sync commit and its parts, sequential, in ms per record (wall / CPU): one sync
    ``Journal.append`` (thread hand-off, multi-row INSERT, fsync, settle); the same INSERT
    committed inline with ``synchronous=FULL`` and with ``NORMAL`` (no fsync); and a bare
    event loop -> thread -> event loop round trip with nothing to do."""
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(_appends(Path(tmp), records, out))
        asyncio.run(_round_trips(records, out))
        _inline(Path(tmp), "FULL", records, out)
        _inline(Path(tmp), "NORMAL", records, out)
    return out
