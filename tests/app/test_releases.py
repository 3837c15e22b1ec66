"""vLLM 0.33.0 and 0.34.0 in front of the whole proxy (the fake answers as their code does):
``/v1/decisions`` metered in the Responses shape, joint reads refused unless opted in, and
a client's ``X-Cache-Salt`` never sent while the proxy salts per tenant."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.support.proxies import FAKE_ROUTES, fake_and_proxy
from tests.support.records import journal_records

QUESTION = {"type": "predicate", "instructions": "Is it raining?"}
DECISION = {"model": "minilm", "input": "It rains.", "questions": [QUESTION]}


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
async def test_openai_decisions_are_billed_in_the_responses_shape(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path, version: str
) -> None:
    """``/v1/decisions`` reports ``input_tokens`` (the whole prompt: cache reads and cache
    writes are both inside it) and ``output_tokens``: billed as they are, the cached part
    recorded, the cache writes not added again."""
    fake, client = await fake_and_proxy(
        aiohttp_server, aiohttp_client, minilm_path, version=version
    )
    resp = await client.post("/v1/decisions", json=DECISION)
    assert resp.status == 200, await resp.text()
    (record,) = journal_records(tmp_path / "journal.sqlite")
    assert (record.operation, record.endpoint) == ("decisions", "/v1/decisions")
    assert (record.prompt_tokens_billed, record.completion_tokens_billed) == (12, 3)
    assert record.units.cached_prompt_tokens == 8
    assert fake.prompt_tokens_total == 12


@pytest.mark.parametrize("path", ["/v1/decisions", "/v1/systemone"])
async def test_joint_reads_are_refused_unless_allowed(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path, path: str
) -> None:
    """A joint read (0.33+) runs one engine request per canvas of questions, padded to a
    width its usage does not show: refused with 400 naming --allow-unmetered
    decisions.joint, nothing forwarded; ``"joint": "true"`` is no joint read (vLLM's
    StrictBool refuses it) and is forwarded for vLLM to answer."""
    fake, client = await fake_and_proxy(
        aiohttp_server, aiohttp_client, minilm_path, version="0.34.0"
    )
    resp = await client.post(path, json={**DECISION, "joint": True})
    assert resp.status == 400
    error = (await resp.json())["error"]
    assert "--allow-unmetered decisions.joint" in error["message"]
    assert error["param"] == "joint"
    assert fake.seen_headers == []
    assert journal_records(tmp_path / "journal.sqlite") == []
    await client.post(path, json={**DECISION, "joint": "true"})
    assert len(fake.seen_headers) == 1


async def test_joint_reads_relay_unmetered_by_opt_in(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """With --allow-unmetered decisions.joint the request reaches vLLM (which answers it
    as the model can) and no record is made."""
    fake, client = await fake_and_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        version="0.34.0",
        allow_unmetered=f"{FAKE_ROUTES},decisions.joint",
    )
    resp = await client.post("/v1/decisions", json={**DECISION, "joint": True})
    assert resp.status == 400  # the fake's model is no DiffusionGemma: vLLM's own answer
    assert "DiffusionGemma" in (await resp.json())["error"]["message"]
    assert (len(fake.seen_headers), fake.prompt_tokens_total) == (1, 0)
    assert journal_records(tmp_path / "journal.sqlite") == []


@pytest.mark.parametrize(("salting", "sent"), [("tenant", None), ("off", "mine")])
async def test_a_client_cache_salt_header_is_not_sent_while_salting_per_tenant(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, salting: str, sent: Any
) -> None:
    """An ``X-Cache-Salt`` header (an open vLLM change: it would override the body's
    salt) is dropped under --cache-salt tenant, as a client's body salt is never the one
    vLLM sees; with --cache-salt off it is passed as the body's is."""
    fake, client = await fake_and_proxy(
        aiohttp_server, aiohttp_client, minilm_path, version="0.34.0", cache_salt=salting
    )
    chat = {"model": "minilm", "messages": [{"role": "user", "content": "hi"}]}
    resp = await client.post("/v1/chat/completions", json=chat, headers={"X-Cache-Salt": "mine"})
    assert resp.status == 200
    (seen,) = fake.seen_headers
    assert seen.get("X-Cache-Salt") == sent


# A pooling route and a scoring route whose usage is vLLM's UsageInfo, and a chat.
POOLED = [
    ("/v1/embeddings", {"model": "minilm", "input": "Paris is in France."}),
    ("/score", {"model": "minilm", "text_1": "Where is Paris?", "text_2": "In France."}),
    ("/v1/chat/completions", {"model": "minilm", "messages": []}),
]


# UsageInfo's members as vLLM serializes them (``serve/engine/protocol.py``, the 0.32.0
# and 0.34.0 wheels): ``completion_tokens_details`` is null on these routes in both;
# 0.34.0 leaves out a ``prompt_tokens_details`` that is None.
USAGE_INFO = {"prompt_tokens", "total_tokens", "completion_tokens", "completion_tokens_details"}


@pytest.mark.parametrize(("path", "body"), POOLED, ids=[p for p, _ in POOLED])
@pytest.mark.parametrize("version", ["0.32.0", "0.34.0"])
async def test_usage_without_prompt_tokens_details_bills_as_before(
    aiohttp_server: Any,
    aiohttp_client: Any,
    minilm_path: Path,
    tmp_path: Path,
    version: str,
    path: str,
    body: dict[str, Any],
) -> None:
    """0.34.0 leaves ``usage.prompt_tokens_details`` out when there is none (0.32 sent
    ``null``): the client gets the member as vLLM wrote it or not at all, and the record
    bills the same prompt with no cached tokens either way. The fake's usage has the
    members UsageInfo serializes to in each release (before, embeddings and chat left out
    ``completion_tokens_details``, which both send as null)."""
    _, client = await fake_and_proxy(aiohttp_server, aiohttp_client, minilm_path, version=version)
    resp = await client.post(path, json=body)
    assert resp.status == 200, await resp.text()
    usage = (await resp.json())["usage"]
    details = {"prompt_tokens_details"} if version == "0.32.0" else set()
    assert set(usage) == USAGE_INFO | details
    assert usage.get("prompt_tokens_details") is None
    assert usage["completion_tokens_details"] is None
    (record,) = journal_records(tmp_path / "journal.sqlite")
    assert record.prompt_tokens_billed == usage["prompt_tokens"]
    assert record.units.cached_prompt_tokens is None


@pytest.mark.parametrize(("version", "cached"), [("0.32.0", None), ("0.34.0", 4)])
async def test_batch_chat_records_the_cached_tokens_it_reports(
    aiohttp_server: Any,
    aiohttp_client: Any,
    minilm_path: Path,
    tmp_path: Path,
    version: str,
    cached: int | None,
) -> None:
    """With --enable-prompt-tokens-details, ``/v1/chat/completions/batch`` reports its
    conversations' cached prompt tokens from 0.34.0 on (0.32 reported none): recorded as
    the chat's are, part of the prompt billed, not added to it."""
    fake, client = await fake_and_proxy(
        aiohttp_server, aiohttp_client, minilm_path, version=version
    )
    fake.prompt_tokens_details = True
    conversations = [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "yo"}]]
    resp = await client.post("/v1/chat/completions/batch", json={"messages": conversations})
    assert resp.status == 200
    (record,) = journal_records(tmp_path / "journal.sqlite")
    assert (record.prompt_tokens_billed, record.completion_tokens_billed) == (5, 3)
    assert record.units.cached_prompt_tokens == cached


async def test_a_streamed_chat_records_the_split_its_usage_reports(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """0.34.0's streamed chat with continuous usage stats carries the cached split from
    its first chunk on (the role chunk; the content chunks' usage has none): the client
    gets every chunk as vLLM wrote it, and the record takes the stream's last usage, its
    cached tokens included."""
    fake, client = await fake_and_proxy(
        aiohttp_server, aiohttp_client, minilm_path, version="0.34.0"
    )
    fake.prompt_tokens_details = True
    options = {"include_usage": True, "continuous_usage_stats": True}
    body = {"model": "minilm", "messages": [], "stream": True, "stream_options": options}
    resp = await client.post("/v1/chat/completions", json=body)
    text = await resp.text()
    events = [json.loads(line[6:]) for line in text.split("\n\n") if line[6:].startswith("{")]
    first = events[0]["usage"]
    assert first["prompt_tokens_details"]["cached_tokens"] == fake.cached_tokens
    assert "prompt_tokens_details" not in events[1]["usage"]
    (record,) = journal_records(tmp_path / "journal.sqlite")
    assert (record.prompt_tokens_billed, record.completion_tokens_billed) == (5, 3)
    assert record.units.cached_prompt_tokens == fake.cached_tokens


IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}


@web.middleware
async def scores_images(request: web.Request, handler: Any) -> web.StreamResponse:
    """A multimodal reranker of 0.34.0: a document of several images is scored (0.33
    answered 400), the engine's tokens reported."""
    if request.path != "/rerank":
        return await handler(request)  # type: ignore[no-any-return]
    body = await request.json()
    images = sum(len(d["content"]) for d in body["documents"] if isinstance(d, dict))
    usage = {"prompt_tokens": 7 + 64 * images, "total_tokens": 7 + 64 * images}
    return web.json_response({"id": "rerank-1", "model": "minilm", "usage": usage, "results": []})


async def test_a_document_of_several_images_is_billed_as_reported(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """A rerank document may hold several images from 0.34.0 on. The proxy counts no
    image: as for a one-image document, the request is forwarded (not refused) and billed
    as reported, unaudited (no full recount proved the model)."""
    _, client = await fake_and_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        version="0.34.0",
        middlewares=(scores_images,),
    )
    body = {"model": "minilm", "query": "a cat", "documents": [{"content": [IMAGE, IMAGE]}]}
    resp = await client.post("/rerank", json=body)
    assert resp.status == 200, await resp.text()
    (record,) = journal_records(tmp_path / "journal.sqlite")
    assert record.prompt_tokens_billed == 7 + 64 * 2
    assert record.verdict == "unaudited"


@pytest.mark.parametrize("version", ["0.32.0", "0.34.0"])
async def test_continuous_usage_the_client_did_not_get_is_not_asked_for(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path, version: str
) -> None:
    """Regression: a stream with ``continuous_usage_stats`` but no ``include_usage`` gets
    no usage from vLLM (it needs both); the proxy asked for ``include_usage`` to bill it
    and so turned the client's continuous usage on: every chunk reached the client with a
    usage it would not have had (from 0.34.0 the first with the cached split). The proxy
    asks for the last usage alone now: the client's chunks are vLLM's, and it is billed."""
    fake, client = await fake_and_proxy(
        aiohttp_server, aiohttp_client, minilm_path, version=version
    )
    fake.prompt_tokens_details = True
    options = {"continuous_usage_stats": True}
    body = {"model": "minilm", "messages": [], "stream": True, "stream_options": options}
    resp = await client.post("/v1/chat/completions", json=body)
    text = await resp.text()
    assert '"usage"' not in text
    assert text.endswith("data: [DONE]\n\n")
    (record,) = journal_records(tmp_path / "journal.sqlite")
    assert (record.prompt_tokens_billed, record.completion_tokens_billed) == (5, 3)
