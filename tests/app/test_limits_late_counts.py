"""Issue #58's late recounts under a token budget, the other way: a scoring request whose
count does not come within ``--accounting-timeout`` is priced at its bound (every query
and document at the context), and a bound beyond the whole limit says nothing of the
request itself. It is not told that it can never be admitted when its count fits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy.serving import audited
from tests.support.engine_reads import LONG, at_the_cap, burst
from tests.support.proxies import limited_proxy

# 30 documents: 2,572 tokens counted, 31 x 1,024 at the bound.
RERANK = json.dumps({"query": LONG, "documents": [f"{LONG} {i}" for i in range(30)]}).encode()
LIMIT = {"prompt_tokens_per_day": 10000}


async def test_a_late_count_is_not_refused_as_never_admissible(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """A rerank whose count came late was refused 400 "can never be admitted; reduce it"
    because its bound (31,744 tokens) is more than the 10,000-token limit, while counted
    it is 2,572, which the limit admits (the next test). The late one is a 503 to try
    again, saying its count did not come in time."""
    fake, statuses = await burst(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        tmp_path,
        LIMIT,
        "/rerank",
        RERANK,
        1,
        accounting_timeout=0.000001,
    )
    ((status, text),) = statuses
    message = json.loads(text)["error"]["message"]
    assert "can never be admitted" not in message, message
    assert status == 503, text
    assert "not counted within" in message, message
    assert fake.prompt_tokens_total == 0


async def test_the_same_rerank_counted_in_time_is_admitted(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """The request of the test above, counted in time under the same limit: admitted,
    its count well within the limit (what makes "never" untrue)."""
    fake, statuses = await burst(
        aiohttp_server, aiohttp_client, minilm_path, tmp_path, LIMIT, "/rerank", RERANK, 1
    )
    assert [s for s, _ in statuses] == [200], statuses
    assert 0 < fake.prompt_tokens_total <= 10000


async def test_a_count_that_fails_is_not_the_requests_fault(
    aiohttp_server: Any,
    aiohttp_client: Any,
    minilm_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rerank whose count fails in the proxy (here every count raises, as a tokenizer
    error or a crashed worker does) was told 400 "can never be admitted; reduce it"
    because its bound is beyond the limit, while counted it fits: the failure is the
    proxy's, not the request's. It is priced at its bound as a late count is: a 503 to
    try again soon, saying it could not be counted."""

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the tokenizer failed")

    monkeypatch.setattr(audited, "analyse", broken)
    fake, statuses = await burst(
        aiohttp_server, aiohttp_client, minilm_path, tmp_path, LIMIT, "/rerank", RERANK, 1
    )
    ((status, text),) = statuses
    message = json.loads(text)["error"]["message"]
    assert "can never be admitted" not in message, message
    assert status == 503, text
    assert "could not be counted" in message, message
    assert fake.prompt_tokens_total == 0


async def test_a_late_bound_beyond_what_is_left_is_told_to_retry_soon(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """Reranks never counted in time, each priced at its bound (31,744 tokens) under a
    40,000-token day: admitted while the bound fits what is left, each settled at its
    2,572 tokens; then one is refused, and was told to try again at midnight (the
    budget's reset, hours away, with ``x-should-retry: false``) where the same request
    counted on a retry (2,572 tokens) fits at once. It is told to retry in a second,
    and the engine never works past the budget."""
    fake, client = await limited_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        tmp_path,
        {"tenants": {"acme": {"prompt_tokens_per_day": 40000}}},
        version="0.32.0",
        fake_class=at_the_cap(1024),
        accounting_timeout=0.000001,
    )
    refused = None
    for turn in range(8):
        rerank = {"query": LONG, "documents": [f"{LONG} {turn} {i}" for i in range(30)]}
        resp = await client.post("/rerank", json=rerank, headers={"X-Tenant-Id": "acme"})
        if resp.status != 200:
            refused = resp, json.loads(await resp.text())["error"]["message"]
            break
    assert refused is not None
    resp, message = refused
    assert resp.status == 429, message
    assert "not counted within" in message, message
    assert "try again in 1s" in message, message
    assert resp.headers["retry-after"] == "1", dict(resp.headers)
    assert resp.headers.get("x-should-retry") != "false", dict(resp.headers)
    assert fake.prompt_tokens_total <= 40000
