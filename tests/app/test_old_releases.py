"""The proxy in front of releases older than 0.27 (issue #31): what differs there."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.proxies import fake_and_proxy
from tests.support.records import journal_records
from tests.support.texts import DOCS, QUERY

LONG = "The capital of France is Paris. " * 25


async def start(aiohttp_server: Any, aiohttp_client: Any, root: Path, version: str) -> Any:
    return await fake_and_proxy(
        aiohttp_server, aiohttp_client, root, version=version, tenant_header="X-Tenant-Id"
    )


@pytest.mark.parametrize(
    ("version", "members"),
    [("0.8.5", ["total_tokens"]), ("0.12.0", ["total_tokens"]), ("0.13.0", None)],
)
async def test_total_tokens_only_is_corrected_and_billed_at_the_engine_count(
    aiohttp_server: Any,
    aiohttp_client: Any,
    minilm_path: Path,
    tmp_path: Path,
    version: str,
    members: list[str] | None,
) -> None:
    """Before 0.13 rerank usage is ``{"total_tokens"}`` only (measured on 0.8.5, 0.10.2;
    RerankUsage in 0.12.0 and 0.13.0): the client gets
    the corrected total_tokens (no prompt_tokens added), the record bills the engine."""
    fake, client = await start(aiohttp_server, aiohttp_client, minilm_path, version)
    before = fake.prompt_tokens_total
    resp = await client.post("/rerank", json={"query": QUERY, "documents": DOCS})
    assert resp.status == 200
    engine = fake.prompt_tokens_total - before
    upstream, body = json.loads(fake.last_body), await resp.json()
    assert list(upstream["usage"]) == (members or ["prompt_tokens", "total_tokens"])
    assert list(body["usage"]) == list(upstream["usage"])
    assert body["usage"]["total_tokens"] == engine == 36
    assert upstream["usage"]["total_tokens"] == 57
    assert resp.headers["x-usage-verdict"] == "corrected"
    assert resp.headers["x-usage-upstream-prompt-tokens"] == "57"
    (record,) = journal_records(tmp_path / "journal.sqlite")
    assert (record.prompt_tokens_reported, record.prompt_tokens_billed) == (57, engine)
    assert record.verdict == "corrected"


@pytest.mark.parametrize("version", ["0.15.1", "0.18.0", "0.19.1", "0.20.2"])
async def test_truncation_side_left_as_each_release_applies_it(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, version: str
) -> None:
    """Before 0.19 truncation_side is an unknown extra: truncate_prompt_tokens cuts the
    tokenizer's way (specials kept) instead of slicing; an input longer than k keeps k
    tokens either way. 0.19.x does not truncate at all with "left" (make compat on
    0.19.1); 0.20 slices. Each is billed what its engine processed."""
    fake, client = await start(aiohttp_server, aiohttp_client, minilm_path, version)
    before = fake.prompt_tokens_total
    body = {"query": QUERY, "documents": [LONG, DOCS[1]]}
    body |= {"truncate_prompt_tokens": 12, "truncation_side": "left"}
    resp = await client.post("/rerank", json=body)
    assert resp.status == 200
    assert resp.headers["x-usage-verdict"] == "corrected"
    assert (await resp.json())["usage"]["prompt_tokens"] == fake.prompt_tokens_total - before


@pytest.mark.parametrize("version", ["0.15.1", "0.19.0"])
async def test_max_tokens_per_doc_is_ignored_before_0_20(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, version: str
) -> None:
    """Before 0.20 max_tokens_per_query/doc are unknown extras: the whole text is encoded
    and billed (the fake never cuts, as those releases)."""
    fake, client = await start(aiohttp_server, aiohttp_client, minilm_path, version)
    before = fake.prompt_tokens_total
    body = {"query": QUERY, "documents": [LONG, DOCS[0]], "max_tokens_per_doc": 10}
    resp = await client.post("/rerank", json=body)
    assert resp.status == 200
    assert resp.headers["x-usage-verdict"] == "corrected"
    assert (await resp.json())["usage"]["prompt_tokens"] == fake.prompt_tokens_total - before
