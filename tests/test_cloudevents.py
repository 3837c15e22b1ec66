"""CloudEvents export to a local receiver: event shape, batching, outage and recovery."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from aiohttp import web

from proxy.ledger.journal import Journal
from proxy.ledger.outbox import Outbox
from proxy.ledger.sinks.cloudevents import BATCH_CONTENT_TYPE, CloudEventsSink
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


class StrictReceiver:
    """Demands a bearer token; rejects a batch holding an event of tenant 'evil' with 400
    (as OpenMeter does for an event it cannot ingest); can ask to come back later."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.events: list[dict[str, Any]] = []
        self.unauthorized = 0
        self.throttle: str | None = None
        self.rejecting = True

    async def ingest(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            self.unauthorized += 1
            return web.Response(status=401)
        if self.throttle is not None:
            retry, self.throttle = self.throttle, None
            return web.Response(status=429, headers={"Retry-After": retry})
        batch = await request.json()
        if self.rejecting and any(e["subject"] == "evil" for e in batch):
            return web.json_response({"detail": "invalid event"}, status=400)
        self.events.extend(batch)
        return web.Response(status=204)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/api/v1/events", self.ingest)
        return app


async def test_bearer_header_dead_letter_and_replay(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path, monkeypatch: Any
) -> None:
    """Regression: the sink sent no credentials, and any 4xx was retried forever. The
    headers come from USAGE_PROXY_CLOUDEVENTS_HEADERS (never argv, never logged); a
    rejected record is isolated and dead-lettered while the rest is delivered; after the
    receiver is fixed, `usage-proxy dead-letters replay` delivers it."""
    from proxy.cli import main
    from proxy.ledger.journal_files import list_dead_letters
    from proxy.serving.keys import METRICS, RECORDER
    from proxy.serving.tenancy import key_digest
    from tests.conftest import eventually, fake_and_proxy

    receiver = StrictReceiver("om-secret-token")
    server = await aiohttp_server(receiver.app())
    monkeypatch.setenv(
        "USAGE_PROXY_CLOUDEVENTS_HEADERS", '{"Authorization": "Bearer om-secret-token"}'
    )
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"acme: {key_digest('k-acme')}\nevil: {key_digest('k-evil')}\n")
    _, client = await fake_and_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        api_keys=keys,
        cloudevents_url=str(server.make_url("/api/v1/events")),
        reconcile_interval=0,
    )
    body = {"query": "What is the capital of France?", "documents": ["Paris.", "Berlin."]}
    ids = []
    for key in ["k-acme"] * 3 + ["k-evil"] + ["k-acme"] * 3:
        resp = await client.post("/rerank", json=body, headers={"Authorization": f"Bearer {key}"})
        ids.append(resp.headers["x-usage-record-id"])
    journal = client.app[RECORDER].journal
    assert journal is not None

    async def delivered() -> bool:
        return await journal.backlog("cloudevents") == 0

    await eventually(delivered)
    assert sorted(e["id"] for e in receiver.events) == sorted(ids[:3] + ids[4:])
    assert receiver.unauthorized == 0
    text = client.app[METRICS].render().decode()
    assert 'usage_proxy_export_dead_records{sink="cloudevents"} 1.0' in text
    (letter,) = list_dead_letters(journal.path)
    assert (letter.record_id, letter.sink) == (ids[3], "cloudevents")
    assert "400" in letter.error

    receiver.rejecting = False
    assert main(["dead-letters", "replay", "--journal", str(journal.path)]) == 0

    async def replayed() -> bool:
        return ids[3] in {e["id"] for e in receiver.events}

    await eventually(replayed)
    assert list_dead_letters(journal.path) == []
    assert "om-secret-token" not in text


async def test_retry_after_is_honoured(aiohttp_server: Any, tmp_path: Path) -> None:
    """429 with Retry-After: the sink waits what the receiver asked, then delivers."""
    receiver = StrictReceiver("t")
    receiver.throttle = "1"
    server = await aiohttp_server(receiver.app())
    journal = Journal(tmp_path / "j.sqlite")
    await journal.open()
    sink = CloudEventsSink(
        str(server.make_url("/api/v1/events")), headers={"Authorization": "Bearer t"}
    )
    outbox = Outbox(journal, [sink], min_backoff=0.01, max_backoff=0.05, poll_interval=0.05)
    await outbox.start()
    await journal.append(make_record(1))
    await asyncio.sleep(0.3)
    assert receiver.events == []
    assert 0.9 <= outbox.state["cloudevents"].backoff <= 1.0
    for _ in range(60):
        if receiver.events:
            break
        await asyncio.sleep(0.05)
    assert len(receiver.events) == 1
    await outbox.drain(2)
    await journal.close()
