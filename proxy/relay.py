"""Transparent pass-through for every request that is not audited.

Bodies stream both ways; server-sent events reach the client chunk by chunk.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import structlog
from aiohttp import web
from multidict import CIMultiDict

from proxy.exchanges import body_timeout, read_within
from proxy.metrics import upstream_failure
from proxy.upstream import SESSION, UpstreamError, exchange, response_headers

log = structlog.get_logger("proxy.relay")


def abort(request: web.Request, exc: BaseException) -> None:
    """The upstream failed mid-body: cut the client connection so the truncation shows.

    Headers are already sent, so no error status is possible; a clean end of stream would
    pass a partial body off as complete.
    """
    log.warning("upstream_failed_mid_body", path=request.path, error=type(exc).__name__)
    if request.transport is not None:
        request.transport.close()


# Bodies up to this size are received in full (within --body-read-timeout) before an
# upstream connection is taken: a client that trickles its upload holds no vLLM connection.
BUFFERED_BODY_BYTES = 1024 * 1024


class Relay:
    """aiohttp handler relaying a request to the upstream unchanged."""

    def __init__(self, upstream_base: str, body_read_timeout: float) -> None:
        self._base = upstream_base
        self._body_timeout = body_read_timeout

    async def handle(self, request: web.Request) -> web.StreamResponse:
        data: Any = request.content if request.body_exists else None
        length = request.content_length
        if data is not None and length is not None and length <= BUFFERED_BODY_BYTES:
            try:
                data = await read_within(request, self._body_timeout)
            except TimeoutError:
                return body_timeout(self._body_timeout)
        try:
            async with exchange(request.app[SESSION], self._base, request, data) as upstream:
                headers = response_headers(upstream.headers, keep_length=True)
                return await pass_on(request, upstream, b"", headers)
        except UpstreamError as exc:
            return upstream_failure(request, exc)


async def pass_on_unread(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    head: bytes,
    settle: Callable[[], Awaitable[dict[str, str]]],
) -> web.StreamResponse:
    """An answer above --max-answer-bytes is never held: it is passed on as it arrives,
    unread. A successful one is settled first (recorded ``invalid``, nothing billed) and
    carries the headers ``settle`` returns."""
    headers = response_headers(upstream.headers, keep_length=True)
    if 200 <= upstream.status < 300:
        log.warning("answer_passed_on_unread", path=request.path)
        headers.update(await settle())
    return await pass_on(request, upstream, head, headers)


async def pass_on(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    head: bytes,
    headers: CIMultiDict[str],
) -> web.StreamResponse:
    """Stream the upstream's answer to the client as it arrives: ``head`` (the part
    already read), then the rest. A failure mid-body cuts the client connection."""
    reply = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=headers)
    await reply.prepare(request)
    try:
        if head:
            await reply.write(head)
        async for chunk in upstream.content.iter_any():
            await reply.write(chunk)
    except (aiohttp.ClientError, TimeoutError) as exc:
        abort(request, exc)
        return reply
    await reply.write_eof()
    return reply
