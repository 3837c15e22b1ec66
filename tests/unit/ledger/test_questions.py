"""The usage API's questions answered from records (``ledger.questions``): a record
states what vLLM reported against what is billed, and the source it was read from; and
the module a reading process imports pulls in no server (aiohttp), which is what keeps a
reader small and quick to start."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
from pathlib import Path

from proxy.ledger.lookup import RecordSource
from proxy.ledger.questions import read_record, record_json
from proxy.ledger.sinks.postgres import PostgresLedger
from proxy.ledger.sqlite import as_row, create_schema
from tests.support.postgres import Cluster, fresh_database
from tests.support.records import make_record


def test_a_record_states_reported_billed_units_and_amount() -> None:
    """What vLLM reported against what is billed, the units, and the amount at the
    record's price; without prices no amount."""
    record = make_record(1, reported=57, billed=36)
    body = record_json(record, None)
    assert body["reported"] == {"prompt_tokens": 57, "completion_tokens": None}
    assert body["billed"] == {"prompt_tokens": 36, "completion_tokens": None}
    assert body["units"] == {"prompt_tokens": 36}
    assert body["verdict"] == "corrected"
    assert "amount" not in body


def test_a_reader_imports_no_server() -> None:
    """Importing the questions (what a spawned reader imports) loads neither aiohttp nor
    the serving package's modules: a reader started in 3.2 s at 85 MiB importing the
    server, 0.6 s at 36 MiB without it (review of #62)."""
    probe = (
        "import sys, proxy.ledger.questions, proxy.serving.usage_reads\n"
        "print(sorted(m for m in sys.modules if m == 'aiohttp' or m.startswith('proxy.serving.')"
        " and m != 'proxy.serving.usage_reads'))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


async def test_a_record_says_the_source_it_was_read_from(tmp_path: Path, postgres: Cluster) -> None:
    """With a ledger, a delivered record is answered from the ledger and says so; one
    the outbox has not delivered yet is found in this replica's journal, and says that,
    not the ledger (audit of #62: every record answer said "ledger")."""
    delivered, pending = make_record(1), make_record(2)
    db = sqlite3.connect(tmp_path / "j.sqlite")
    create_schema(db)
    db.executemany(
        "INSERT INTO records(record_id, time, tenant, body, kind) VALUES (?,?,?,?,?)",
        [as_row(r) for r in (delivered, pending)],
    )
    db.commit()
    db.close()
    dsn = await fresh_database(postgres)
    ledger = PostgresLedger(dsn)
    await ledger.start()
    await ledger.deliver([delivered])
    await ledger.close()
    source = RecordSource(dsn, tmp_path / "j.sqlite")

    def said(record_id: str) -> tuple[object, object, object]:
        found = read_record(source, "acme", record_id, None)
        assert found is not None
        return found["source"], found["holds"], found["record"]["record_id"]  # type: ignore[index]

    assert await asyncio.to_thread(said, delivered.record_id) == (
        "ledger",
        "every replica's records",
        delivered.record_id,
    )
    assert await asyncio.to_thread(said, pending.record_id) == (
        "journal",
        "this replica's records only",
        pending.record_id,
    )
