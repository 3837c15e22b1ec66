"""The upstream side of connections: one session, never more than --upstream-connections,
and never a request sent on a connection vLLM is closing."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from proxy.serving.upstream import SESSION
from tests.support.fakevllm import VLLM_KEEP_ALIVE
from tests.support.proxies import fake_and_proxy

GOOD = {"query": "What is the capital of France?", "documents": ["Paris.", "Berlin."]}


async def test_upstream_connections_are_capped(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path
) -> None:
    """The one ClientSession never opens more than --upstream-connections to vLLM."""
    _, client = await fake_and_proxy(
        aiohttp_server, aiohttp_client, minilm_path, upstream_connections=3
    )
    assert client.app[SESSION].connector.limit == 3


def closes_idle_connections(after: float) -> Any:
    """vLLM's keep-alive (uvicorn closes a connection idle for ``after`` seconds), with its
    race made certain: a request that reaches a connection idle that long finds it closed,
    as one does that the proxy sent while vLLM's close was on its way."""
    answered: dict[Any, float] = {}

    @web.middleware
    async def middleware(request: web.Request, handler: Any) -> web.StreamResponse:
        last = answered.get(request.protocol)
        if last is not None and time.monotonic() - last >= after:
            assert request.transport is not None
            request.transport.close()
            return web.Response()  # written to a closed connection: the client sees none
        try:
            return await handler(request)
        finally:
            answered[request.protocol] = time.monotonic()

    return middleware


async def test_a_connection_vllm_closes_when_idle_is_not_reused(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path
) -> None:
    """Regression (CI, in front of real vLLM 0.32.0: a 502 where vLLM answered 200): the
    proxy kept idle upstream connections for 30 s, vLLM closes them after 5 s, so a request
    sent about 5 s after the last one could go out on a connection vLLM was closing. The
    proxy now lets an idle connection go after --upstream-keepalive (2 s), before vLLM does."""
    fake, client = await fake_and_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        middlewares=(closes_idle_connections(VLLM_KEEP_ALIVE),),
        reconcile_interval=0,  # no reading of vLLM's metrics between the two requests
    )
    first = await client.post("/rerank", json=GOOD)
    assert first.status == 200
    await asyncio.sleep(VLLM_KEEP_ALIVE + 0.2)
    second = await client.post("/rerank", json=GOOD)
    assert second.status == 200, await second.text()
    assert fake.prompt_tokens_total == 2 * int(first.headers["x-usage-engine-prompt-tokens"])
