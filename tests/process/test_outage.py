"""Sink outages under load, through a real proxy process: the PostgreSQL ledger and the
CloudEvents receiver are down for OUTAGE_SECONDS (default 30) while clients keep sending;
afterwards every answered request is in both, exactly once."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from proxy.ledger.sinks.cloudevents import EVENT_TYPE
from scripts.vllm_cpu import Process
from tests.support.load import rerank
from tests.support.postgres import Cluster, fresh_database
from tests.support.processes import start_ledgered_proxy
from tests.support.receivers import Receiver

OUTAGE = float(os.environ.get("OUTAGE_SECONDS", "30"))


async def load(url: str, until: float, received: list[str]) -> None:
    """Four clients sending reranks with fresh request ids until ``until``."""

    async def client(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < until:
            await rerank(session, url, f"outage-{uuid.uuid4().hex}", received)
            await asyncio.sleep(0.01)

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(client(session) for _ in range(4)))


async def test_ledger_and_receiver_down_under_load(
    postgres: Cluster, fake_upstream: Process, tmp_path: Path, aiohttp_server: Any
) -> None:
    """Outage mid-load, then recovery: 0 lost, 0 duplicated in both sinks."""
    receiver = Receiver()
    server = await aiohttp_server(receiver.app())
    dsn = await fresh_database(postgres)
    events = str(server.make_url("/api/v1/events"))
    proxy = start_ledgered_proxy(fake_upstream.url, tmp_path, dsn, "--cloudevents-url", events)
    received: list[str] = []
    try:
        started = time.monotonic()
        traffic = asyncio.create_task(load(proxy.url, started + OUTAGE + 6, received))
        await asyncio.sleep(2)
        postgres.stop()
        receiver.failing = True
        await asyncio.sleep(OUTAGE)
        postgres.start()
        receiver.failing = False
        during = len(received)
        await traffic
        ids = set(received)
        conn = await asyncpg.connect(dsn)
        try:
            for _ in range(600):
                rows = [
                    r["id"]
                    for r in await conn.fetch("SELECT record_id::text AS id FROM usage_records")
                ]
                events = [e["id"] for e in receiver.events if e["type"] == EVENT_TYPE]
                if ids <= set(rows) and ids <= set(events):
                    break
                await asyncio.sleep(0.1)
        finally:
            await conn.close()
    finally:
        proxy.stop()
        if receiver.failing:
            postgres.start()
    assert ids - set(rows) == set()
    assert ids - set(events) == set()
    assert len(rows) == len(set(rows))
    assert len(set(events)) == len(set(rows))
    print(
        f"outage test: {OUTAGE:.0f} s down, {during} answered until it ended, "
        f"{len(received)} in all, ledger {len(rows)} rows, {len(events)} events "
        f"({len(events) - len(set(events))} redelivered, deduplicated by id)"
    )
