"""The CloudEvents exporter behind the whole proxy: bearer headers, dead letters and replay."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.receivers import StrictReceiver


async def test_bearer_header_dead_letter_and_replay(
    aiohttp_server: Any,
    aiohttp_client: Any,
    minilm_path: Path,
    tmp_path: Path,
    monkeypatch: Any,
    api_keys: Any,
) -> None:
    """Regression: the sink sent no credentials, and any 4xx was retried forever. The
    headers come from USAGE_PROXY_CLOUDEVENTS_HEADERS (never argv, never logged); a
    rejected record is isolated and dead-lettered while the rest is delivered; after the
    receiver is fixed, `usage-proxy dead-letters replay` delivers it."""
    from proxy.cli import main
    from proxy.ledger.journal_files import list_dead_letters
    from proxy.serving.keys import METRICS, RECORDER
    from tests.support.proxies import fake_and_proxy
    from tests.support.waits import eventually

    receiver = StrictReceiver("om-secret-token")
    server = await aiohttp_server(receiver.app())
    monkeypatch.setenv(
        "USAGE_PROXY_CLOUDEVENTS_HEADERS", '{"Authorization": "Bearer om-secret-token"}'
    )
    _, client = await fake_and_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        api_keys=api_keys(acme="k-acme", evil="k-evil"),
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

    dead_gauge = 'usage_proxy_export_dead_records{sink="cloudevents"} 1.0'

    async def delivered() -> bool:
        # The outbox acks the last batch, then (after two more journal round trips) sets
        # the dead-records gauge: wait for the gauge, not only for the empty backlog.
        if await journal.backlog("cloudevents") != 0:
            return False
        return dead_gauge in client.app[METRICS].render().decode()

    await eventually(delivered)
    assert sorted(e["id"] for e in receiver.events) == sorted(ids[:3] + ids[4:])
    assert receiver.unauthorized == 0
    text = client.app[METRICS].render().decode()
    assert dead_gauge in text
    (letter,) = list_dead_letters(journal.path)
    assert (letter.record_id, letter.sink) == (ids[3], "cloudevents")
    assert "400" in letter.error

    receiver.rejecting = False
    assert main(["dead-letters", "replay", "--journal", str(journal.path)]) == 0

    async def replayed() -> bool:
        # The receiver has the event before the outbox revives the dead letter (after the
        # 204): wait for both.
        if ids[3] not in {e["id"] for e in receiver.events}:
            return False
        return list_dead_letters(journal.path) == []

    await eventually(replayed)
    assert [e["id"] for e in receiver.events].count(ids[3]) == 1
    assert "om-secret-token" not in text
