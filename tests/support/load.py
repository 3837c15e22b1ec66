"""Load on a proxy running as its own process: rerank requests from many clients at once."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp

BODY = {
    "query": "What is the capital of France?",
    "documents": ["Paris is the capital of France.", "Berlin is in Germany."],
}


async def rerank(
    session: aiohttp.ClientSession, url: str, request_id: str, received: list[str]
) -> None:
    """One rerank as client ``request_id``; the proxy's record id of a 200 answer that
    arrived in full joins ``received``."""
    headers = {"X-Request-Id": request_id}
    async with session.post(url + "/rerank", json=BODY, headers=headers) as resp:
        await resp.read()
        if resp.status == 200:
            received.append(resp.headers["x-usage-record-id"])


async def fire(url: str, ids: list[str], received: list[str], concurrency: int) -> None:
    """Send one rerank per client id; remember the proxy's record ids of the 200 responses
    that arrived in full."""
    queue: asyncio.Queue[str] = asyncio.Queue()
    for request_id in ids:
        queue.put_nowait(request_id)

    async def worker(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            request_id = queue.get_nowait()
            with contextlib.suppress(TimeoutError, aiohttp.ClientError):
                await rerank(session, url, request_id, received)

    timeout = aiohttp.ClientTimeout(total=20)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
