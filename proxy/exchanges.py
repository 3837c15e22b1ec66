"""I/O steps the audited and the metered paths share: read the client's body, run work
that scales with a body off the event loop, make the upstream's answer readable, and the
answer's headers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.encoding import content_codings, decode_body
from proxy.upstream import response_headers

T = TypeVar("T")
# Below this many bytes, parsing inline costs less than a hop to a thread.
INLINE_BYTES = 64 * 1024


async def read_body(request: web.Request) -> bytes:
    """The whole request body (aiohttp enforces --max-body-bytes while reading)."""
    return await request.read()


async def off_loop(fn: Callable[..., T], body: bytes, *args: Any) -> T:
    """``fn(*args)`` in a worker thread when ``body`` is large, inline when small."""
    if len(body) < INLINE_BYTES:
        return fn(*args)
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


async def readable_body(payload: bytes, headers: Any, limit: int) -> bytes:
    """The answer with any Content-Encoding undone (raises UnreadableBody)."""
    codings = headers.get("Content-Encoding")
    if not content_codings(codings):
        return payload
    return await asyncio.get_running_loop().run_in_executor(
        None, decode_body, payload, codings, limit
    )


def reply_headers(upstream: CIMultiDictProxy[str] | CIMultiDict[str]) -> CIMultiDict[str]:
    """Headers for a re-framed answer whose body the proxy holds decoded."""
    headers = response_headers(upstream, keep_length=False)
    headers.popall("Content-Encoding", None)
    return headers
