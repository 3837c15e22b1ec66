"""Records through the proxy: scoring, embeddings, chat (streamed or not), attribution."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from proxy.serving.app import create_app
from proxy.serving.tenancy import key_digest
from proxy.settings import Settings
from tests.support.proxies import fake_and_proxy
from tests.support.records import journal_records
from tests.support.texts import DOCS, QUERY

ACME = {"Authorization": "Bearer sk-acme"}


@pytest.fixture
async def metered(exporting: Any) -> Any:
    """Proxy with a key map (acme) and a tenant header, exporting JSON lines."""
    return await exporting({"acme": "sk-acme"}, tenant_header="X-Tenant-Id", instance="test-1")


async def test_scoring_record_is_committed_before_the_response(metered: Any) -> None:
    """When the client has the answer, the journal already holds R, E and the verdict."""
    _, client, journal, _ = metered
    resp = await client.post(
        "/rerank",
        json={"query": QUERY, "documents": DOCS},
        headers={"Authorization": "Bearer sk-acme", "X-Request-Id": "req-1"},
    )
    assert resp.status == 200
    assert "x-litellm-total-tokens" not in resp.headers  # the option is gone (see docs)
    (record,) = journal_records(journal)
    assert record.record_id == resp.headers["x-usage-record-id"]
    assert record.client_request_id == "req-1"
    assert (record.tenant, record.key_hash) == ("acme", key_digest("sk-acme")[:12])
    assert (record.prompt_tokens_reported, record.prompt_tokens_billed) == (57, 36)
    assert (record.verdict, record.m, record.n, record.status) == ("corrected", 1, 3, 200)
    assert record.upstream_version == "0.29.0"
    assert record.model == "minilm"
    assert record.instance == "test-1"


async def test_errors_are_not_recorded(metered: Any) -> None:
    """A 400 from vLLM reports no usage and produces no record."""
    _, client, journal, _ = metered
    resp = await client.post("/score", json={"text_1": [QUERY, "b"], "text_2": DOCS}, headers=ACME)
    assert resp.status == 400
    assert journal_records(journal) == []


async def test_trusted_header_and_anonymous(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """Without a key map the configured tenant header names the tenant (a gateway sets
    it); no header means anonymous."""
    _, client = await fake_and_proxy(
        aiohttp_server, aiohttp_client, minilm_path, tenant_header="X-Tenant-Id"
    )
    await client.post(
        "/score", json={"text_1": QUERY, "text_2": DOCS[0]}, headers={"X-Tenant-Id": "team-b"}
    )
    await client.post("/score", json={"text_1": QUERY, "text_2": DOCS[0]})
    journal = tmp_path / "journal.sqlite"
    assert [r.tenant for r in journal_records(journal)] == ["team-b", "anonymous"]


async def test_chat_stream_usage_recorded_and_hidden(metered: Any, aiohttp_server: Any) -> None:
    """A stream without include_usage: the proxy asks for it, records it, strips it."""
    _, client, journal, _ = metered
    resp = await client.post(
        "/v1/chat/completions",
        json={"model": "minilm", "stream": True, "messages": []},
        headers=ACME,
    )
    text = await resp.text()
    assert "usage" not in text
    assert text.endswith("data: [DONE]\n\n")
    (record,) = journal_records(journal)
    assert (record.operation, record.prompt_tokens_billed, record.completion_tokens_billed) == (
        "chat",
        5,
        3,
    )


async def test_chat_stream_usage_kept_when_asked(metered: Any) -> None:
    """A client that asked for include_usage still gets its usage chunk."""
    _, client, journal, _ = metered
    resp = await client.post(
        "/v1/chat/completions",
        json={"stream": True, "stream_options": {"include_usage": True}, "messages": []},
        headers=ACME,
    )
    assert '"usage"' in await resp.text()
    assert len(journal_records(journal)) == 1


async def test_non_stream_chat_and_jsonl_export(metered: Any) -> None:
    """Non-streamed usage is recorded and exported to JSON lines."""
    _, client, journal, jsonl = metered
    resp = await client.post("/v1/chat/completions", json={"messages": []}, headers=ACME)
    assert (await resp.json())["usage"]["total_tokens"] == 8
    (record,) = journal_records(journal)
    for _ in range(100):
        if jsonl.exists() and jsonl.read_text():
            break
        await asyncio.sleep(0.05)
    assert json.loads(jsonl.read_text().splitlines()[0])["record_id"] == record.record_id


async def test_journal_failure_never_fails_the_request(metered: Any) -> None:
    """A broken journal: the client still gets vLLM's answer, flagged x-usage-record."""
    from proxy.serving.keys import RECORDER

    _, client, _, _ = metered
    meter = client.app[RECORDER]
    assert meter.journal is not None

    def broken(rows: Any) -> None:
        raise OSError(28, "No space left on device")

    meter.journal._insert = broken
    resp = await client.post("/rerank", json={"query": QUERY, "documents": DOCS}, headers=ACME)
    assert resp.status == 200
    assert resp.headers["x-usage-record"] == "failed"
    assert (await resp.json())["usage"]["prompt_tokens"] == 36
    assert meter.failed == 1


async def test_unknown_paths_are_refused_or_relayed_unmetered_by_opt_in(
    aiohttp_server: Any, aiohttp_client: Any
) -> None:
    """An unknown path is refused (the closed world); relayed as it is, never metered
    (whatever usage its answer shows), only when --allow-unmetered names it."""
    seen: list[str] = []

    async def other(request: web.Request) -> web.Response:
        seen.append(request.path)
        return web.json_response({"usage": {"prompt_tokens": 1}})

    app = web.Application()
    app.router.add_post("/v1/other", other)
    server = await aiohttp_server(app)
    upstream = str(server.make_url(""))
    closed = await aiohttp_client(create_app(Settings(upstream=upstream, accounting_timeout=0.1)))
    assert (await closed.post("/v1/other", json={})).status == 404
    assert seen == []
    allowed = await aiohttp_client(
        create_app(Settings(upstream=upstream, accounting_timeout=0.1, allow_unmetered="/v1/*"))
    )
    resp = await allowed.post("/v1/other", json={})
    assert "x-usage-record" not in resp.headers
    assert (await resp.json()) == {"usage": {"prompt_tokens": 1}}
    assert seen == ["/v1/other"]


async def test_shutdown_with_healthy_exporters_is_prompt(metered: Any) -> None:
    """With every record delivered, closing the app does not wait for --drain-timeout."""
    import time

    _, client, _, _ = metered
    await client.post("/v1/chat/completions", json={"messages": []}, headers=ACME)
    started = time.monotonic()
    await client.close()
    assert time.monotonic() - started < 5
