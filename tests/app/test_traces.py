"""One request's W3C trace, end to end: the trace id the client knows is the one the
(fake) vLLM received in ``traceparent``, the one in the journal's record, the PostgreSQL
ledger's row and the CloudEvent; a hostile traceparent restarts the trace, never a 500."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import asyncpg
import pytest

from proxy.ledger.sinks.postgres import read_ledger
from tests.support.postgres import (
    Cluster,
    fresh_database,
    postgres,  # noqa: F401  (session fixture)
)
from tests.support.proxies import fake_and_proxy
from tests.support.receivers import Receiver
from tests.support.records import journal_records
from tests.support.waits import eventually

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENTS = f"00-{TRACE}-00f067aa0ba902b7-01"
CHAT = {"model": "minilm", "messages": [{"role": "user", "content": "hi"}]}


async def exporting(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, dsn: str
) -> tuple[Any, Any, Receiver]:
    receiver = Receiver()
    events = await aiohttp_server(receiver.app())
    fake, client = await fake_and_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        ledger_dsn=dsn,
        cloudevents_url=str(events.make_url("/api/v1/events")),
    )
    return fake, client, receiver


@pytest.mark.parametrize("sent", [CLIENTS, None])
async def test_one_trace_id_at_the_client_upstream_and_in_every_record(
    aiohttp_server: Any,
    aiohttp_client: Any,
    minilm_path: Path,
    tmp_path: Path,
    postgres: Cluster,  # noqa: F811
    sent: str | None,
) -> None:
    """With the client's traceparent, its trace id; without one, the trace the proxy
    started, told to the client in ``traceresponse``: the same id in the header vLLM
    received, the journaled record, the ledger row and the CloudEvent's traceparent."""
    dsn = await fresh_database(postgres)
    fake, client, receiver = await exporting(aiohttp_server, aiohttp_client, minilm_path, dsn)
    headers = {"traceparent": sent} if sent else {}
    resp = await client.post("/v1/chat/completions", json=CHAT, headers=headers)
    assert resp.status == 200
    at_client = resp.headers["traceresponse"]
    assert at_client == sent if sent else at_client.startswith("00-")
    trace_id = at_client[3:35]
    (upstream,) = fake.seen_headers
    assert upstream.getall("traceparent") == [at_client]
    (record,) = journal_records(tmp_path / "journal.sqlite")
    assert (record.trace_id, record.traceparent) == (trace_id, at_client)

    async def delivered() -> bool:
        try:
            rows = await read_ledger(dsn, None, None)
        except asyncpg.UndefinedTableError:  # the ledger makes its table on first delivery
            return False
        return len(receiver.events) == 1 and len(rows) == 1

    await eventually(delivered)
    (row,) = await read_ledger(dsn, None, None)
    assert (row.record_id, row.trace_id, row.traceparent) == (record.record_id, trace_id, at_client)
    (event,) = receiver.events
    assert (event["id"], event["traceparent"]) == (record.record_id, at_client)


@pytest.mark.parametrize(
    "hostile",
    [
        [("traceparent", "00-zz-not-a-trace-01")],
        [("traceparent", CLIENTS.upper())],
        [("traceparent", f"00-{'0' * 32}-00f067aa0ba902b7-01")],
        [("traceparent", "cc-" + "a" * 4000)],
        [("traceparent", CLIENTS), ("traceparent", f"00-{'1' * 32}-00f067aa0ba902b7-01")],
        [("traceparent", CLIENTS), ("tracestate", "x" * 600)],
    ],
)
async def test_a_hostile_traceparent_restarts_the_trace(
    open_proxy: Any, tmp_path: Path, hostile: list[tuple[str, str]]
) -> None:
    """Malformed, uppercase, zero, oversized or repeated: the request is served (never a
    500), sent upstream in one new valid trace with no tracestate, and billed in it; an
    oversized tracestate alone is dropped while a valid traceparent is kept."""
    fake, client = open_proxy
    resp = await client.post("/v1/chat/completions", json=CHAT, headers=hostile)
    assert resp.status == 200
    (upstream,) = fake.seen_headers
    (sent,) = upstream.getall("traceparent")
    assert "tracestate" not in upstream
    assert sent == resp.headers["traceresponse"]
    kept = len(hostile) == 2 and hostile[1][0] == "tracestate"
    assert (sent == CLIENTS) is kept
    (record,) = journal_records(tmp_path / "journal.sqlite")
    assert record.traceparent == sent
