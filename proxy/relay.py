"""Transparent pass-through for every request that is not audited.

Bodies stream both ways; server-sent events reach the client chunk by chunk.
"""

from __future__ import annotations

from aiohttp import web

from proxy.metrics import upstream_failure
from proxy.upstream import SESSION, UpstreamError, exchange, response_headers


class Relay:
    """aiohttp handler relaying a request to the upstream unchanged."""

    def __init__(self, upstream_base: str) -> None:
        self._base = upstream_base

    async def handle(self, request: web.Request) -> web.StreamResponse:
        data = request.content if request.body_exists else None
        try:
            async with exchange(request.app[SESSION], self._base, request, data) as upstream:
                reply = web.StreamResponse(
                    status=upstream.status,
                    reason=upstream.reason,
                    headers=response_headers(upstream.headers, keep_length=True),
                )
                await reply.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await reply.write(chunk)
                await reply.write_eof()
                return reply
        except UpstreamError as exc:
            return upstream_failure(request, exc)
