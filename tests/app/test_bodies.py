"""Request bodies: uploads that stall are cut, bodies held at once stay within their
budget (503 past it), and a huge document is proven without being tokenized."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from proxy.ledger.journal_files import read_journal
from proxy.serving.exchange import EXCHANGES
from tests.support.proxies import fake_and_proxy
from tests.support.sockets import trickle

RERANK = json.dumps({"query": "What is the capital of France?", "documents": ["Paris."]})


@pytest.fixture
async def tight(aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path) -> Any:
    return await fake_and_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        max_inflight_body_bytes=4096,
        body_read_timeout=0.5,
        tenant_share=1.0,  # one tenant: the global budget is what is tested
    )


@pytest.mark.parametrize("path", ["/rerank", "/v1/embeddings", "/echo/upload"])
async def test_stalled_upload_is_cut_by_the_deadline(tight: Any, path: str) -> None:
    """Regression: uploads stalled one byte short were held with no timeout (and on
    pass-through paths each held a vLLM connection). Now 408 after --body-read-timeout,
    and nothing reached the upstream."""
    fake, client = tight
    reader, writer = await trickle(client.server.port, path, 1000, b'{"query": ')
    answer = await asyncio.wait_for(reader.read(4096), 5)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 408")
    assert b"Connection: close" in answer
    assert b"RequestTimeout" in answer
    assert fake.raw_bodies == []
    assert fake.seen_headers == []
    assert client.app[EXCHANGES].budget.held == 0


async def test_bodies_over_the_budget_get_503_with_retry_after(tight: Any) -> None:
    """Regression: no admission limit (20 concurrent 60 MiB bodies peaked at 3.5 GB).
    While one body holds the budget, the next gets vLLM-shaped 503 + Retry-After; once it
    is released, requests are admitted again."""
    _, client = tight
    reader, writer = await trickle(client.server.port, "/rerank", 4090, b"{")
    await asyncio.sleep(0.1)
    resp = await client.post("/rerank", data=RERANK, headers={"Content-Type": "application/json"})
    assert resp.status == 503
    assert resp.headers["Retry-After"] == "1"
    assert (await resp.json())["error"]["type"] == "ServiceUnavailable"
    assert (await asyncio.wait_for(reader.read(4096), 5)).startswith(b"HTTP/1.1 408")
    writer.close()
    assert client.app[EXCHANGES].budget.held == 0
    ok = await client.post("/rerank", data=RERANK, headers={"Content-Type": "application/json"})
    assert ok.status == 200


async def test_a_lone_body_larger_than_the_budget_is_still_served(tight: Any) -> None:
    """The budget bounds bodies held together; one body alone is limited only by
    --max-body-bytes, so a big but legal request is never refused on an idle proxy."""
    _, client = tight
    docs = ["Paris is the capital of France."] * 300
    body = json.dumps({"query": "q", "documents": docs})
    assert len(body) > 4096
    resp = await client.post("/rerank", data=body, headers={"Content-Type": "application/json"})
    assert resp.status == 200


async def test_giant_word_is_proven_by_derivation_not_tokenized(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """A document that is one 100 KiB word is not tokenized by the proxy (memory bound);
    once full recounts proved the model, the correction is still made from the query
    length alone, as vLLM's engine saw it. Before that proof it is billed as reported."""

    _, client = await fake_and_proxy(aiohttp_server, aiohttp_client, minilm_path)
    body = {"query": "What is the capital of France?", "documents": ["a" * 100_000, "Paris."]}
    resp = await client.post("/rerank", json=body)
    assert resp.headers["x-usage-verdict"] == "unaudited"  # no shortcut before the proof
    for _ in range(3):  # --trust-after-recounts: three full recounts that agree
        proving = await client.post("/rerank", json={"query": "q", "documents": ["a", "b"]})
        assert proving.headers["x-usage-verdict"] == "corrected"
    resp = await client.post("/rerank", json=body)
    assert resp.status == 200
    assert resp.headers["x-usage-verdict"] == "corrected"
    records = [json.loads(r) for r in read_journal(tmp_path / "journal.sqlite")]
    assert records[0]["prompt_tokens_billed"] == records[0]["prompt_tokens_reported"]
    # Q = 9; the giant word is one [UNK]: D = 3 and 4 ("Paris." is [CLS] paris . [SEP])
    assert records[-1]["prompt_tokens_billed"] == 9 + 3 + 4
