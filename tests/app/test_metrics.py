"""Prometheus metrics: verdicts, tokens, GenAI histogram, tenant cap, admin port."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from proxy.serving.app import create_app
from proxy.settings import Settings
from tests.support.proxies import fake_and_proxy
from tests.support.texts import DOCS, QUERY


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def start(aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, **options: Any) -> Any:
    _, client = await fake_and_proxy(aiohttp_server, aiohttp_client, minilm_path, **options)
    return client


async def test_scoring_metrics(aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path) -> None:
    """Two corrected reranks: 114 reported, 72 billed, 42 over-reported; GenAI input tokens."""
    client = await start(aiohttp_server, aiohttp_client, minilm_path)
    for _ in range(2):
        await client.post("/rerank", json={"query": QUERY, "documents": DOCS})
    got = samples(await (await client.get("/metrics")).text())
    labels = (("endpoint", "/rerank"), ("model", "minilm"))
    assert got[("usage_proxy_audited_requests_total", (*labels, ("verdict", "corrected")))] == 2
    assert got[("usage_proxy_reported_prompt_tokens_total", labels)] == 114
    assert got[("usage_proxy_billed_prompt_tokens_total", labels)] == 72
    assert got[("usage_proxy_over_reported_prompt_tokens_total", labels)] == 42
    genai = (
        ("gen_ai_operation_name", "rerank"),
        ("gen_ai_request_model", "minilm"),
        ("gen_ai_token_type", "input"),
    )
    assert got[("gen_ai_client_token_usage_token_sum", genai)] == 72
    assert got[("usage_proxy_added_latency_seconds_count", ())] == 2


async def test_upstream_errors_counted(aiohttp_client: Any) -> None:
    """A 502 the proxy produced is counted by status."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings = Settings(upstream=f"http://127.0.0.1:{port}", accounting_timeout=0.1)
    client = await aiohttp_client(create_app(settings))
    assert (await client.get("/v1/models")).status == 502
    got = samples(await (await client.get("/metrics")).text())
    assert got[("usage_proxy_upstream_errors_total", (("status", "502"),))] == 1


async def test_admin_port_serves_metrics_and_health(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path
) -> None:
    """With --admin-port, /metrics moves there (not forwarded upstream from the main port)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        admin_port = sock.getsockname()[1]
    client = await start(
        aiohttp_server, aiohttp_client, minilm_path, admin_port=admin_port, admin_host="127.0.0.1"
    )
    async with aiohttp.ClientSession() as session:
        for path in ("/metrics", "/healthz", "/readyz"):
            async with session.get(f"http://127.0.0.1:{admin_port}{path}") as resp:
                assert resp.status == 200, path
    main = await client.get("/metrics")
    assert "usage_proxy_audited_requests" not in await main.text()


async def test_admin_port_serves_the_upstreams_metrics(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path
) -> None:
    """Issue #39 case 13: in the pod vLLM listens on loopback only, so Prometheus reads its
    counters through the proxy's admin port, /upstream/metrics (the main port has none)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        admin_port = sock.getsockname()[1]
    client = await start(
        aiohttp_server, aiohttp_client, minilm_path, admin_port=admin_port, admin_host="127.0.0.1"
    )
    await client.post("/rerank", json={"query": QUERY, "documents": DOCS})
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{admin_port}/upstream/metrics") as resp,
    ):
        assert resp.status == 200
        text = await resp.text()
    assert "vllm:prompt_tokens_total" in text
    assert "usage_proxy_" not in text
    assert (await client.get("/upstream/metrics")).status != 200


async def test_token_counters_cover_every_metered_operation_per_tenant(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """Issue #39 case 5: after chat and embeddings requests there was no per-tenant token
    counter for them (only the scoring paths had series) and completion tokens were only in
    the GenAI histogram, without a tenant. Now the prompt counters cover every metered
    operation and completion counters exist, by tenant on the admin port, equal to the
    records."""
    from tests.support.records import journal_records

    admin_port = free_port()
    client = await start(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        tenant_header="X-Tenant-Id",
        metrics_tenant_label=True,
        admin_port=admin_port,
        admin_host="127.0.0.1",
    )
    chat = {"messages": [{"role": "user", "content": "Where is Paris?"}]}
    resp = await client.post("/v1/chat/completions", json=chat, headers={"X-Tenant-Id": "a"})
    assert resp.status == 200
    resp = await client.post("/v1/embeddings", json={"input": QUERY}, headers={"X-Tenant-Id": "b"})
    assert resp.status == 200
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{admin_port}/metrics") as page,
    ):
        got = samples(await page.text())
    for r in journal_records(tmp_path / "journal.sqlite"):
        labels = (("endpoint", r.endpoint), ("model", "minilm"), ("tenant", r.tenant))
        assert got[("usage_proxy_reported_prompt_tokens_total", labels)] == (
            r.prompt_tokens_reported
        )
        assert got[("usage_proxy_billed_prompt_tokens_total", labels)] == r.prompt_tokens_billed
        if r.operation == "chat":
            assert r.completion_tokens_billed
            assert got[("usage_proxy_billed_completion_tokens_total", labels)] == (
                r.completion_tokens_billed
            )
            assert got[("usage_proxy_reported_completion_tokens_total", labels)] == (
                r.completion_tokens_reported
            )
    assert {r.operation for r in journal_records(tmp_path / "journal.sqlite")} == {
        "chat",
        "embeddings",
    }


async def test_cached_tokens_and_audio_seconds_have_their_counters_per_tenant(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """Issue #54 item 7: audio seconds and cached prompt tokens were in the records and the
    report but had no metric. Each has a counter by endpoint, model and (on the admin port,
    with --metrics-tenant-label) tenant, equal to the records."""
    import io

    from tests.support.fakevllm.audio import wav
    from tests.support.records import journal_records

    admin_port = free_port()
    fake, client = await fake_and_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        version="0.32.0",
        tenant_header="X-Tenant-Id",
        metrics_tenant_label=True,
        admin_port=admin_port,
        admin_host="127.0.0.1",
        journal=str(tmp_path / "journal.sqlite"),
    )
    fake.prompt_tokens_details = True  # vLLM's --enable-prompt-tokens-details
    chat = {"messages": [{"role": "user", "content": "Where is Paris?"}]}
    for _ in range(2):
        resp = await client.post("/v1/chat/completions", json=chat, headers={"X-Tenant-Id": "a"})
        assert resp.status == 200
    form = aiohttp.FormData()
    form.add_field("file", io.BytesIO(wav(2.5)), filename="a.wav", content_type="audio/wav")
    form.add_field("model", "minilm")
    transcription = "/v1/audio/transcriptions"
    resp = await client.post(transcription, data=form, headers={"X-Tenant-Id": "b"})
    assert resp.status == 200
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{admin_port}/metrics") as page,
    ):
        got = samples(await page.text())
    records = journal_records(tmp_path / "journal.sqlite")
    cached = sum(r.units.cached_prompt_tokens or 0 for r in records)
    seconds = sum(r.units.audio_seconds or 0 for r in records)
    assert (cached, seconds) == (2 * fake.cached_tokens, 3)
    chat_labels = (("endpoint", "/v1/chat/completions"), ("model", "minilm"), ("tenant", "a"))
    audio_labels = (("endpoint", transcription), ("model", "minilm"), ("tenant", "b"))
    assert got[("usage_proxy_billed_cached_prompt_tokens_total", chat_labels)] == cached
    assert got[("usage_proxy_billed_audio_seconds_total", audio_labels)] == seconds


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_the_backlog_counts_the_shards_a_smaller_pod_adopted(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """A worker that delivers a shard its pod no longer writes (a scale-down) shows that
    shard's undelivered records in the backlog gauge, beside its own shard's: 2 records
    left in worker 1's shard and 1 of its own, none delivered (the exporter is down),
    make a backlog of 3, not 1."""
    left = tmp_path / "left"
    left.mkdir()
    first = await start(aiohttp_server, aiohttp_client, minilm_path, journal=str(left / "j.sqlite"))
    for _ in range(2):
        assert (await first.post("/rerank", json={"query": QUERY, "documents": DOCS})).status == 200
    await first.close()
    shard = (left / "j.sqlite").rename(tmp_path / "journal.worker-1.sqlite")
    with socket.socket() as closed:  # a port nothing listens on: every delivery fails
        closed.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{closed.getsockname()[1]}/events"
    _, client = await fake_and_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        journal=str(tmp_path / "journal.sqlite"),
        cloudevents_url=down,
        adopted=[shard],
    )
    assert (await client.post("/rerank", json={"query": QUERY, "documents": DOCS})).status == 200
    backlog = ("usage_proxy_export_backlog_records", (("sink", "cloudevents"),))
    for _ in range(100):
        got = samples(await (await client.get("/metrics")).text())
        if got.get(backlog) == 3:
            break
        await asyncio.sleep(0.1)
    assert got.get(backlog) == 3
