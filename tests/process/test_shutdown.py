"""SIGTERM under load and a full journal disk: nothing a client received goes unrecorded
(SIGTERM), and a journal that cannot write never stops serving (disk full)."""

from __future__ import annotations

import asyncio
import signal
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from proxy.serving.app import create_app
from proxy.serving.catalog import CATALOG
from proxy.serving.keys import METRICS, RECORDER
from proxy.settings import Settings
from scripts.vllm_cpu import Process
from tests.support.fakevllm import FakeVLLM
from tests.support.load import fire
from tests.support.postgres import Cluster, fresh_database
from tests.support.processes import start_ledgered_proxy

GOOD = {"query": "What is the capital of France?", "documents": ["Paris.", "Berlin."]}


async def test_sigterm_under_load_drains_everything(
    postgres: Cluster, fake_upstream: Process, tmp_path: Path
) -> None:
    """SIGTERM mid-load: in-flight requests finish, every answered request is in the ledger."""
    dsn = await fresh_database(postgres)
    proxy = start_ledgered_proxy(fake_upstream.url, tmp_path, dsn, "--drain-timeout", "20")
    received: list[str] = []
    ids = [f"term-{uuid.uuid4().hex}" for _ in range(600)]
    load = asyncio.create_task(fire(proxy.url, ids, received, concurrency=12))
    while len(received) < 100:
        await asyncio.sleep(0.01)
    proxy.popen.send_signal(signal.SIGTERM)
    await load
    assert proxy.popen.wait(40) == 0
    conn = await asyncpg.connect(dsn)
    try:
        rows = {
            r["id"] for r in await conn.fetch("SELECT record_id::text AS id FROM usage_records")
        }
        total = await conn.fetchval("SELECT count(*) FROM usage_records")
    finally:
        await conn.close()
    assert [i for i in received if i not in rows] == []
    assert total == len(rows)
    print(f"sigterm test: {len(received)} answered, {total} ledger rows, 0 lost")


@pytest.mark.usefixtures("_journal_in_tmp")
async def test_full_journal_keeps_serving(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path
) -> None:
    """SQLITE_FULL (a real one, via max_page_count): served, flagged, counted, recovers."""
    from transformers import AutoTokenizer

    fake = FakeVLLM(AutoTokenizer.from_pretrained(str(minilm_path)), minilm_path)
    server = await aiohttp_server(fake.app())
    client = await aiohttp_client(create_app(Settings(upstream=str(server.make_url("")))))
    assert await client.app[CATALOG].wait_ready(10)
    journal = client.app[RECORDER].journal
    assert journal is not None
    assert journal._db is not None
    db = journal._db
    pages = await journal._run(lambda: db.execute("PRAGMA page_count").fetchone()[0])
    await journal._run(db.execute, f"PRAGMA max_page_count = {pages}")
    statuses = []
    for _ in range(30):
        resp = await client.post("/rerank", json={**GOOD, "documents": [uuid.uuid4().hex * 20]})
        statuses.append((resp.status, resp.headers.get("x-usage-record")))
    assert {s for s, _ in statuses} == {200}
    assert ("200", "failed") in {(str(s), f) for s, f in statuses}
    assert client.app[METRICS].journal_failures._value.get() >= 1
    await journal._run(db.execute, "PRAGMA max_page_count = 1073741823")
    ok = await client.post("/rerank", json=GOOD)
    assert ok.status == 200
    assert "x-usage-record" not in ok.headers
