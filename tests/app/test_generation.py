"""Billing integrity of generation and dispatch (issue #10): lax stream flags, batch chat,
Messages, Responses and structured decisions, clients that hang up, /invocations,
encoded slashes and the default model. Each test reproduces one reported case."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from yarl import URL

from proxy.ledger.journal_files import read_journal
from proxy.serving.catalog import CATALOG
from proxy.serving.keys import METRICS
from proxy.serving.upstream import SESSION
from tests.support.proxies import fake_and_proxy
from tests.support.records import journal_records
from tests.support.texts import DOCS, QUERY, RERANK


@pytest.mark.parametrize("stream", ["true", 1, "1"])
async def test_lax_stream_flag_is_metered(open_proxy: Any, tmp_path: Path, stream: Any) -> None:
    """Regression: "stream": "true" or 1 streamed without include_usage: no record."""
    _, client = open_proxy
    resp = await client.post("/v1/chat/completions", json={"stream": stream, "messages": []})
    text = await resp.text()
    assert text.endswith("data: [DONE]\n\n")
    assert '"usage"' not in text
    (record,) = journal_records(tmp_path / "journal.sqlite")
    assert (record.prompt_tokens_billed, record.completion_tokens_billed) == (5, 3)


async def test_batch_chat_is_metered(open_proxy: Any, tmp_path: Path) -> None:
    """Regression: vLLM 0.32.0's ``/v1/chat/completions/batch`` (N conversations, one
    usage summing them) was relayed without a record: engine work for free."""
    _, client = open_proxy
    conversations = [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "yo"}]]
    resp = await client.post("/v1/chat/completions/batch", json={"messages": conversations})
    assert resp.status == 200
    (record,) = journal_records(tmp_path / "journal.sqlite")
    assert (record.operation, record.prompt_tokens_billed, record.completion_tokens_billed) == (
        "chat",
        5,
        3,
    )
    assert resp.headers["x-usage-record-id"] == record.record_id


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("path", ["/v1/messages", "/v1/responses"])
async def test_messages_and_responses_are_metered(
    open_proxy: Any, tmp_path: Path, path: str, stream: bool
) -> None:
    """Regression: the Anthropic Messages and Responses APIs (in every supported release)
    were relayed without a record, so a tenant could generate for free by switching API.
    Their usage (``input_tokens``/``output_tokens``; Messages reports the cached part of
    the prompt apart) is billed as the engine's prompt and completion, the cached prompt
    tokens are recorded as reported, and a stream's last event is released once the record
    is committed."""
    fake, client = open_proxy
    body = {"model": "minilm", "stream": stream, "max_tokens": 8}
    body |= {"messages": [{"role": "user", "content": "hi"}]} if path == "/v1/messages" else {}
    body |= {"input": "hi"} if path == "/v1/responses" else {}
    resp = await client.post(path, json=body)
    assert resp.status == 200
    text = await resp.text()
    (record,) = journal_records(tmp_path / "journal.sqlite")
    assert (record.operation, record.verdict) == (path.rsplit("/", 1)[1], "reported")
    assert (record.prompt_tokens_billed, record.completion_tokens_billed) == (12, 3)
    assert fake.prompt_tokens_total == 12  # what the engine's counter says
    # the 8 cached prompt tokens vLLM reports (cache_read_input_tokens, or
    # input_tokens_details.cached_tokens) are recorded as their own unit, within the 12
    assert record.units.reported() == {
        "prompt_tokens": 12,
        "completion_tokens": 3,
        "cached_prompt_tokens": 8,
    }
    if stream:
        last = "message_stop" if path == "/v1/messages" else "response.completed"
        assert text.rstrip().split("\n\n")[-1].startswith(f"event: {last}")
    else:
        assert resp.headers["x-usage-record-id"] == record.record_id


async def test_structured_decisions_are_metered(open_proxy: Any, tmp_path: Path) -> None:
    """Regression: vLLM 0.32.0's ``/v1/systemone`` (structured decisions, its usage as
    ``input_tokens``/``output_tokens``) was relayed without a record."""
    _, client = open_proxy
    resp = await client.post("/v1/systemone", json={"model": "minilm", "state": "s"})
    assert resp.status == 200
    (record,) = journal_records(tmp_path / "journal.sqlite")
    assert (record.operation, record.prompt_tokens_billed, record.completion_tokens_billed) == (
        "decisions",
        12,
        3,
    )


async def test_a_background_response_is_relayed_unmetered_only_by_opt_in(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """A background Responses request is answered ``queued`` at once, with no usage: the
    engine's work is never in an answer the proxy sees. Refused by default
    (tests/app/test_closed_world.py); with --allow-unmetered responses.background it is
    relayed as vLLM answers it, no record, counted."""
    from proxy.serving.keys import METRICS
    from tests.support.proxies import FAKE_ROUTES

    _, client = await fake_and_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        allow_unmetered=f"{FAKE_ROUTES},responses.background",
    )
    body = {"model": "minilm", "input": "hi", "background": True, "store": True}
    resp = await client.post("/v1/responses", json=body)
    assert resp.status == 200
    assert (await resp.json())["status"] == "queued"
    assert journal_records(tmp_path / "journal.sqlite") == []
    counted = client.app[METRICS].unmetered.labels("responses.background")
    assert counted._value.get() == 1


async def test_client_disconnect_mid_stream_is_still_billed(
    open_proxy: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: a client that read 19 of 20 events and left got no record, and the log
    blamed the upstream."""
    fake, client = open_proxy
    fake.chunks, fake.delay = 20, 0.02
    reader, writer = await asyncio.open_connection("127.0.0.1", client.server.port)
    body = json.dumps({"stream": True, "messages": []}).encode()
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    await writer.drain()
    seen = b""
    while seen.count(b"data: ") < 5:
        seen += await reader.read(1024)
    writer.close()
    journal = tmp_path / "journal.sqlite"
    for _ in range(200):
        if read_journal(journal):
            break
        await asyncio.sleep(0.02)
    (record,) = journal_records(journal)
    assert record.aborted
    assert (record.prompt_tokens_billed, record.completion_tokens_billed) == (5, 3)
    assert client.app[METRICS].aborted.labels("/v1/chat/completions")._value.get() == 1


async def test_invocations_are_labelled_like_the_direct_endpoints(
    open_proxy: Any, tmp_path: Path
) -> None:
    """Regression: an embeddings body had model null and verdict unaudited; score and
    rerank bodies had operation other."""
    _, client = open_proxy
    assert (await client.post("/invocations", json=RERANK)).status == 200
    score = {"text_1": QUERY, "text_2": DOCS}
    assert (await client.post("/invocations", json=score)).status == 200
    embed = {"input": ["hello world", "bye"]}
    assert (await client.post("/invocations", json=embed)).status == 200
    got = [
        (r.operation, r.model, r.verdict, r.prompt_tokens_billed)
        for r in journal_records(tmp_path / "journal.sqlite")
    ]
    assert got == [
        ("rerank", "minilm", "corrected", 36),
        ("score", "minilm", "corrected", 36),
        ("embeddings", "minilm", "reported", 7),
    ]


@pytest.mark.parametrize(
    ("target", "operation", "verdict", "billed"),
    [
        ("/v1%2Frerank", "rerank", "corrected", 36),
        ("/v2%2frerank", "rerank", "corrected", 36),
        ("/v1%2Fscore", "score", "corrected", 36),
        ("/v1%2Fembeddings", "embeddings", "reported", 7),
    ],
)
async def test_encoded_slashes_are_routed_as_vllm_routes_them(
    aiohttp_server: Any,
    aiohttp_client: Any,
    minilm_path: Path,
    tmp_path: Path,
    target: str,
    operation: str,
    verdict: str,
    billed: int,
) -> None:
    """Regression: vLLM's server decodes ``%2F`` before routing, aiohttp's router does
    not; ``POST /v1%2Frerank`` was relayed, served by vLLM and never recorded (free). It
    is billed as the endpoint and sent as the path vLLM reads (issue #26)."""
    seen: list[str] = []

    @web.middleware
    async def targets(request: web.Request, handler: Any) -> web.StreamResponse:
        seen.append(request.raw_path)
        return await handler(request)  # type: ignore[no-any-return]

    _, client = await fake_and_proxy(
        aiohttp_server, aiohttp_client, minilm_path, middlewares=(targets,)
    )
    body = {
        "rerank": RERANK,
        "score": {"text_1": QUERY, "text_2": DOCS},
        "embeddings": {"input": ["hello world", "bye"]},
    }[operation]
    resp = await client.post(URL(target, encoded=True), json=body)
    assert resp.status == 200
    (record,) = journal_records(tmp_path / "journal.sqlite")
    assert (record.operation, record.verdict, record.prompt_tokens_billed) == (
        operation,
        verdict,
        billed,
    )
    assert seen[-1] == target.replace("%2F", "/").replace("%2f", "/")  # as vLLM reads it


@pytest.mark.parametrize("model", ["", None, "absent"])
async def test_default_model_is_audited(open_proxy: Any, tmp_path: Path, model: Any) -> None:
    """Regression: "model": "" (vLLM's default, 200) was unaudited and billed 57."""
    fake, client = open_proxy
    fake.aliases = ("second-name",)
    await client.app[CATALOG].refresh(client.app[SESSION])
    body = dict(RERANK) if model == "absent" else {**RERANK, "model": model}
    resp = await client.post("/rerank", json=body)
    assert resp.headers["x-usage-verdict"] == "corrected"
    (record,) = journal_records(tmp_path / "journal.sqlite")
    assert (record.model, record.prompt_tokens_billed) == ("minilm", 36)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_chat_cached_prompt_tokens_are_recorded_as_reported(
    open_proxy: Any, tmp_path: Path, stream: bool
) -> None:
    """With vLLM's --enable-prompt-tokens-details, chat usage carries
    ``prompt_tokens_details.cached_tokens``: recorded as its own unit (whole answer and
    the stream's usage chunk alike); without it nothing is inferred."""
    fake, client = open_proxy
    body = {"model": "minilm", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
    await (await client.post("/v1/chat/completions", json=body)).read()
    fake.prompt_tokens_details = True
    await (await client.post("/v1/chat/completions", json=body)).read()
    without, cached = journal_records(tmp_path / "journal.sqlite")
    assert without.units.cached_prompt_tokens is None
    assert cached.units.reported() == {
        "prompt_tokens": 5,
        "completion_tokens": 3,
        "cached_prompt_tokens": 4,
    }
