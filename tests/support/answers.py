"""Upstream answers shaped for the resource tests: streamed part by part as the test
decides, or an embeddings answer held back until the test releases it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from tests.support.proxies import fake_and_proxy

ANSWER_LIMIT = 64 * 1024


REQUESTS = {
    "/rerank": {"query": "What is the capital of France?", "documents": ["Paris."]},
    "/v1/embeddings": {"input": "Paris."},
}


def streamed_answer(path: str, content_type: str, parts: Callable[[], AsyncIterator[bytes]]) -> Any:
    """A middleware for the fake vLLM: ``path`` is answered 200 with ``parts()`` written
    one by one as they come (other paths as usual)."""
    from aiohttp import web

    @web.middleware
    async def answer(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path != path:
            return await handler(request)  # type: ignore[no-any-return]
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": content_type})
        await response.prepare(request)
        async for part in parts():
            await response.write(part)
        await response.write_eof()
        return response

    return answer


async def slow_embeddings(
    aiohttp_server: Any,
    aiohttp_client: Any,
    minilm_path: Path,
    padding: int,
    limit: int | None = ANSWER_LIMIT,
    **settings: Any,
) -> tuple[Any, bytes, asyncio.Event]:
    """A proxy (--max-answer-bytes ``limit``, None: the default; other ``settings`` as
    given) whose upstream answers embeddings with ``first`` (``padding`` bytes into
    ``data``), then waits for ``release`` to send the rest and the usage (3 tokens)."""
    release = asyncio.Event()
    first = b'{"object": "list", "data": [' + b" " * padding

    async def parts() -> AsyncIterator[bytes]:
        yield first
        await release.wait()
        yield b'], "usage": {"prompt_tokens": 3, "total_tokens": 3}}'

    slow = streamed_answer("/v1/embeddings", "application/json", parts)
    options = settings if limit is None else {"max_answer_bytes": limit, **settings}
    _, client = await fake_and_proxy(
        aiohttp_server, aiohttp_client, minilm_path, middlewares=(slow,), **options
    )
    return client, first, release
