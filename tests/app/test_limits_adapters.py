"""Issue #58's follow-up: a LoRA adapter vLLM lists is served with its base model's
tokenizer (vLLM 0.32.0's pooling and scoring render with the engine's renderer and pass
the adapter only as the engine's ``lora_request``), so the proxy counts and audits its
requests with its parent's tokenizer, not at the bound of an adapter it cannot count."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.engine_reads import LONG, at_the_cap
from tests.support.proxies import limited_proxy

# 30 documents: 2,572 tokens counted, 31 x 1,024 at the bound.
RERANK = {"query": LONG, "documents": [f"{LONG} {i}" for i in range(30)]}


async def test_a_listed_adapters_rerank_is_counted_and_audited_with_its_parents_tokenizer(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """A listed adapter's root is its adapter's path (no tokenizer there), so its rerank
    was priced at its bound (31,744 tokens) and refused under a 10,000-token limit that
    its 2,572 tokens fit, and never recounted. Counted with its parent's tokenizer, it is
    admitted at its count and its answer audited: the same count as its base model's."""
    fake, client = await limited_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        tmp_path,
        {"tenants": {"acme": {"prompt_tokens_per_day": 10000}}},
        version="0.32.0",
        fake_class=at_the_cap(1024, adapters=("acme-lora",)),
    )
    headers = {"X-Tenant-Id": "acme"}
    answers = []
    for model in ("minilm", "acme-lora"):
        resp = await client.post("/rerank", json={**RERANK, "model": model}, headers=headers)
        answers.append((resp.status, resp.headers.get("x-usage-verdict"), await resp.text()))
    (base, base_verdict, base_text), (status, verdict, text) = answers
    assert status == base == 200, text
    assert verdict == base_verdict == "exact", answers
    assert json.loads(text)["usage"] == json.loads(base_text)["usage"]
    assert fake.prompt_tokens_total == 2 * 2572


async def test_a_listed_adapters_embeddings_are_priced_at_their_count(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """Thirty inputs to a listed adapter were priced at the context each (30,720 tokens)
    and refused under a 10,000-token limit their count fits; counted with the parent's
    tokenizer they are admitted, and the engine works what the base model's would."""
    fake, client = await limited_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        tmp_path,
        {"tenants": {"acme": {"prompt_tokens_per_day": 10000}}},
        version="0.32.0",
        fake_class=at_the_cap(1024, adapters=("acme-lora",)),
    )
    body = {"model": "acme-lora", "input": [f"{LONG} {i}" for i in range(30)]}
    resp = await client.post("/v1/embeddings", json=body, headers={"X-Tenant-Id": "acme"})
    assert resp.status == 200, await resp.text()
    assert 0 < fake.prompt_tokens_total <= 10000
