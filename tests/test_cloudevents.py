"""CloudEvents export to a local receiver: event shape, batching, outage and recovery."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from aiohttp import web

from proxy.journal import Journal
from proxy.outbox import Outbox
from proxy.sinks.cloudevents import BATCH_CONTENT_TYPE, CloudEventsSink
from tests.test_postgres_ledger import make_record


class Receiver:
    """An OpenMeter-like ingest endpoint that can be told to fail."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.content_types: set[str] = set()
        self.failing = False

    async def ingest(self, request: web.Request) -> web.Response:
        if self.failing:
            return web.Response(status=503)
        self.content_types.add(request.content_type)
        self.events.extend(await request.json())
        return web.Response(status=204)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/api/v1/events", self.ingest)
        return app


async def test_events_shape_and_exactly_once_after_outage(
    aiohttp_server: Any, tmp_path: Path
) -> None:
    """Receiver down under load, then up: every record arrives, none twice (by id)."""
    receiver = Receiver()
    server = await aiohttp_server(receiver.app())
    journal = Journal(tmp_path / "j.sqlite")
    await journal.open()
    sink = CloudEventsSink(str(server.make_url("/api/v1/events")))
    outbox = Outbox(
        journal, [sink], batch_size=25, min_backoff=0.05, max_backoff=0.2, poll_interval=0.05
    )
    receiver.failing = True
    await outbox.start()
    records = [make_record(i, tenant=f"t{i % 3}") for i in range(120)]
    await asyncio.gather(*(journal.append(r) for r in records))
    await asyncio.sleep(0.4)
    assert receiver.events == []
    assert outbox.state["cloudevents"].failures > 0
    receiver.failing = False
    for _ in range(100):
        if await journal.backlog("cloudevents") == 0:
            break
        await asyncio.sleep(0.05)
    assert await outbox.drain(5) == {"cloudevents": 0}
    await journal.close()
    ids = [e["id"] for e in receiver.events]
    assert sorted(ids) == sorted(r.record_id for r in records)
    assert receiver.content_types == {BATCH_CONTENT_TYPE}
    event = receiver.events[0]
    assert event["specversion"] == "1.0"
    assert event["subject"] == "t0"
    assert event["source"] == "vllm-usage-proxy/test"
    assert event["time"].endswith("Z")
    assert event["data"]["prompt_tokens"] == 36
    assert event["data"]["prompt_tokens_reported"] == 57
    assert event["data"]["verdict"] == "corrected"
