"""Transparent pass-through for every request that is not audited or metered.

Bodies stream both ways; server-sent events reach the client chunk by chunk.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from proxy.metrics import Metrics
from proxy.serving.bodies import body_timeout, read_within
from proxy.serving.downstream import pass_on
from proxy.serving.upstream import (
    SESSION,
    UpstreamError,
    forward,
    response_headers,
    upstream_failure,
)

# Bodies up to this size are received in full (within --body-read-timeout) before an
# upstream connection is taken: a client that trickles its upload holds no vLLM connection.
BUFFERED_BODY_BYTES = 1024 * 1024


class Relay:
    """aiohttp handler relaying a request to the upstream unchanged."""

    def __init__(self, upstream_base: str, body_read_timeout: float, metrics: Metrics) -> None:
        self._base = upstream_base
        self._body_timeout = body_read_timeout
        self._metrics = metrics

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        data: Any = request.content if request.body_exists else None
        length = request.content_length
        if data is not None and length is not None and length <= BUFFERED_BODY_BYTES:
            try:
                data = await read_within(request, self._body_timeout)
            except TimeoutError:
                return body_timeout(self._body_timeout)
        try:
            async with forward(request.app[SESSION], self._base, request, data) as upstream:
                headers = response_headers(upstream.headers, keep_length=True)
                return await pass_on(request, upstream, b"", headers)
        except UpstreamError as exc:
            return upstream_failure(self._metrics, exc)
