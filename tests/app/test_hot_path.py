"""The cheap paths of an audited request (issue #14): counts from the count cache on the
event loop, the pool for anything else, and the same figures either way."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy.accounting.analysis import INLINE_MAX_TEXTS, analyse, analyse_cached, in_full
from proxy.serving.app import POOL
from proxy.serving.audited import AUDITOR
from proxy.serving.catalog import CATALOG
from proxy.tokenizers.cache import EXACT_KEY_CHARS
from proxy.tokenizers.hf import CachedCounts
from tests.support.proxies import fake_and_proxy

DOCS = ["Paris is the capital of France.", "Berlin lies on the Spree.", "안녕하세요 세계"]


def rerank(docs: list[str], **extra: Any) -> bytes:
    return json.dumps({"model": "minilm", "query": "Where is Paris?", "documents": docs, **extra})


async def post(client: Any, body: bytes | str, path: str = "/rerank") -> tuple[int, Any]:
    resp = await client.post(path, data=body, headers={"Content-Type": "application/json"})
    return resp.status, resp.headers


@pytest.fixture
async def proxy(aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path) -> Any:
    _, client = await fake_and_proxy(aiohttp_server, aiohttp_client, minilm_path)
    return client


async def test_texts_seen_before_are_judged_without_the_pool(proxy: Any) -> None:
    """First sight counts in the tokenizer pool; a repeat is judged from the cache on the
    event loop, with the same verdict and counts."""
    calls: list[str] = []
    pool = proxy.app[POOL]
    lane = pool.lane

    def spy(size: int) -> Any:
        calls.append("pool")
        return lane(size)

    pool.lane = spy
    body = rerank(DOCS)
    first = await post(proxy, body)
    second = await post(proxy, body)
    assert calls == ["pool"]
    assert first[0] == second[0] == 200
    for header in ("x-usage-verdict", "x-usage-engine-prompt-tokens"):
        assert first[1][header] == second[1][header]
    assert first[1]["x-usage-verdict"] == "corrected"
    # A new document among known ones goes to the pool again.
    await post(proxy, rerank([*DOCS, "Rome is in Italy."]))
    assert calls == ["pool", "pool"]


async def test_inline_analysis_equals_the_pools(proxy: Any) -> None:
    """Property of the two paths on one catalog: once the pool has counted a body, the
    cache-only analysis of it is the same analysis (counts, model, problem)."""
    catalog, pool = proxy.app[CATALOG], proxy.app[POOL]
    bodies = [
        rerank(DOCS).encode(),
        rerank(DOCS, truncate_prompt_tokens=5).encode(),
        rerank(DOCS, max_tokens_per_doc=3).encode(),  # offsets: never cached
        rerank(["x"] * (INLINE_MAX_TEXTS + 1)).encode(),
        json.dumps({"model": "minilm", "text_1": "a", "text_2": ["b", "c"]}).encode(),
        b'{"model": "nope", "query": "q", "documents": ["d"]}',
        b"not json",
    ]
    for body in bodies:
        path = "/score" if b"text_1" in body else "/rerank"
        for sampled in (True, False):
            full = in_full(sampled, lambda model: True)
            pooled = analyse(body, path, catalog.lookup, pool.local_copy, full)
            inline = analyse_cached(body, path, catalog.lookup, CachedCounts, full)
            if b"max_tokens_per_doc" in body and sampled:
                assert inline is None  # a cut needs offsets: the tokenizer, in the pool
                continue
            if b'"x"' in body:
                assert inline is None  # too many texts to hash on the event loop
                continue
            assert inline is not None, body
            assert (inline.counted, inline.model, inline.problem) == (
                pooled.counted,
                pooled.model,
                pooled.problem,
            )


async def test_a_text_no_cache_key_is_made_of_goes_to_the_pool(proxy: Any) -> None:
    """A long text with a lone surrogate cannot be encoded for a cache digest: the inline
    path gives way instead of failing the handler, and the pool's failure (the tokenizer
    refuses it too) is the audit's ``unaudited``."""
    auditor = proxy.app[AUDITOR]
    text = "\ud800 " + "a " * EXACT_KEY_CHARS
    body = json.dumps({"model": "minilm", "query": text, "documents": ["d"]}).encode()
    with pytest.raises(UnicodeEncodeError):
        analyse_cached(
            body, "/rerank", proxy.app[CATALOG].lookup, CachedCounts, in_full(True, bool)
        )
    counting = auditor._count(body, "/rerank")
    with pytest.raises(UnicodeEncodeError):
        await counting


async def test_without_a_count_cache_every_request_counts_in_the_pool(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path
) -> None:
    """--count-cache-size 0: nothing is judged on the event loop, verdicts are the same."""
    _, client = await fake_and_proxy(
        aiohttp_server, aiohttp_client, minilm_path, count_cache_size=0
    )
    calls: list[int] = []
    pool = client.app[POOL]
    lane = pool.lane
    pool.lane = lambda size: calls.append(size) or lane(size)
    body = rerank(DOCS)
    answers = [await post(client, body) for _ in range(3)]
    assert len(calls) == 3
    assert len({a[1]["x-usage-engine-prompt-tokens"] for a in answers}) == 1
    assert all(a[1]["x-usage-verdict"] == "corrected" for a in answers)
