"""The upstream connection: one reused ClientSession, header hygiene, and the one place
where transport failures become HTTP answers (502 unreachable, 504 timeout)."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from proxy.metrics import Metrics
from proxy.serving.tenancy import connection_tokens
from proxy.serving.tracing import send_trace
from proxy.settings import Settings
from proxy.wire.encoding import content_codings, decode_body
from proxy.wire.targets import Target

SESSION = web.AppKey("upstream_session", aiohttp.ClientSession)
# Bodies above aiohttp's ``TOO_LARGE_BYTES_BODY`` (1 MiB, past which it warns that one write
# may hold the event loop) are sent from a BytesIO, in 64 KiB writes.
LARGE_BODY_BYTES = 1 << 20

# RFC 9110 section 7.6.1 hop-by-hop fields, plus the ones the transport sets itself.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# Headers whose value may be a URL naming the upstream.
LOCATIONS = frozenset({"location", "content-location"})
# What the upstream is sent for a request: its target normalized as vLLM routes it
# (set by the router's guard; absent, the target as the client sent it).
TARGET = web.RequestKey("target", Target)
# Set once a request is sent to the upstream: an exchange that ends in an error without it
# was refused by the proxy itself (a limit, a field it cannot bill), so no engine work.
FORWARDED = web.RequestKey("forwarded", bool)


def served_path(request: web.Request) -> str:
    """The endpoint a request is for: its normalized path (the raw one before routing)."""
    target = request.get(TARGET)
    return target.path if target else request.path


# Headers only this proxy may set: an upstream (or anything before it) must not be able
# to forge what the proxy vouches for.
PROXY_HEADER_PREFIXES = ("x-usage-", "x-litellm-")


class UpstreamError(Exception):
    """The upstream could not be reached or did not answer in time."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def response(self) -> web.Response:
        return error_response(self.status, self.message)


def error_response(
    status: int, message: str, param: str | None = None, kind: str | None = None
) -> web.Response:
    """An error in vLLM's shape: ``{"error": {"message", "type", "param", "code"}}``
    (``kind``: the type vLLM gives that error, when the proxy answers for it)."""
    body = {
        "error": {
            "message": message,
            "type": kind or KINDS.get(status, "ProxyError"),
            "param": param,
            "code": status,
        }
    }
    return web.json_response(body, status=status)


KINDS = {
    400: "BadRequestError",
    401: "Unauthorized",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    405: "MethodNotAllowed",
    408: "RequestTimeout",
    413: "RequestEntityTooLarge",
    429: "TooManyRequests",
    503: "ServiceUnavailable",
    502: "BadGatewayError",
    504: "GatewayTimeoutError",
}


def upstream_failure(metrics: Metrics, exc: UpstreamError) -> web.Response:
    """Count a 502/504 the proxy produced, and return its vLLM-shaped answer."""
    metrics.upstream_errors.labels(str(exc.status)).inc()
    return exc.response()


def unauthorized() -> web.Response:
    """vLLM's own answer to a missing or wrong API key (its authentication middleware)."""
    return web.json_response({"error": "Unauthorized"}, status=401)


def request_headers(headers: Any) -> CIMultiDict[str]:
    """Client headers to send upstream: all but hop-by-hop ones and Host."""
    drop = connection_tokens(headers) | HOP_BY_HOP | {"host"}
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in drop)


def response_headers(headers: Any, *, keep_length: bool) -> CIMultiDict[str]:
    """Upstream headers to send back: all but hop-by-hop (and the length when re-framed);
    a location names no host (``relative``)."""
    drop = connection_tokens(headers) | HOP_BY_HOP
    if not keep_length:
        drop = drop | {"content-length"}
    return CIMultiDict(
        (k, relative(v) if k.lower() in LOCATIONS else v)
        for k, v in headers.items()
        if k.lower() not in drop and not k.lower().startswith(PROXY_HEADER_PREFIXES)
    )


def relative(location: str) -> str:
    """A location as a path on the proxy: the upstream's address (which the upstream
    builds from the Host it was sent) never reaches a client, and a redirect a client
    follows comes back through the proxy."""
    url = URL(location)
    if not url.is_absolute():
        return location
    return url.raw_path_qs + (f"#{url.raw_fragment}" if url.raw_fragment else "")


@contextmanager
def translated(what: str) -> Iterator[None]:
    """The one place where transport failures become 502 (unreachable/invalid) or 504."""
    try:
        yield
    except TimeoutError as exc:
        raise UpstreamError(504, f"{what}: upstream did not answer in time") from exc
    except aiohttp.ClientResponseError as exc:
        raise UpstreamError(
            502, f"{what}: upstream sent an invalid response: {exc.message}"
        ) from exc
    except aiohttp.ClientError as exc:
        raise UpstreamError(502, f"{what}: upstream unreachable: {type(exc).__name__}") from exc


@asynccontextmanager
async def forward(
    session: aiohttp.ClientSession,
    base: str,
    request: web.Request,
    data: Any,
    *,
    metered: bool = False,
    drop: frozenset[str] = frozenset(),
) -> AsyncIterator[aiohttp.ClientResponse]:
    """Send ``request`` (with ``data`` as its body, without the headers named in ``drop``,
    in the request's trace) to the upstream; translate failures.

    On ``metered`` paths the upstream is asked for an uncompressed answer (the proxy must
    read its usage); the client's answer is re-framed anyway.
    Failures inside the caller's block are translated too (e.g. reading a buffered body);
    a caller that has already started streaming to the client must catch them itself.
    """
    target = request.get(TARGET)
    url = URL(base + (target.sent if target else request.rel_url.raw_path_qs), encoded=True)
    headers = request_headers(request.headers)
    for name in drop:
        headers.popall(name, None)
    send_trace(request, headers)
    if isinstance(data, bytes) or "Content-Encoding" in headers:
        headers.popall("Content-Length", None)  # recomputed from the bytes we send
    if isinstance(data, bytes) and len(data) > LARGE_BODY_BYTES:
        data = io.BytesIO(data)  # written in chunks (aiohttp warns of one large write)
    # aiohttp decodes a compressed request body as it is read: what is sent is decoded
    headers.popall("Content-Encoding", None)
    if metered:
        headers["Accept-Encoding"] = "identity"
    request[FORWARDED] = True
    with translated(served_path(request)):
        async with session.request(
            request.method,
            url,
            headers=headers,
            data=data,
            allow_redirects=False,
        ) as response:
            yield response


async def get_json(session: aiohttp.ClientSession, url: str) -> Any:
    """GET a JSON document from the upstream (discovery); raises UpstreamError."""
    with translated(url):
        async with session.get(url, allow_redirects=False) as response:
            response.raise_for_status()
            body = await response.read()
    try:
        return json.loads(body)
    except ValueError as exc:
        raise UpstreamError(502, f"{url}: upstream sent invalid JSON") from exc


def session_context(settings: Settings) -> Any:
    """cleanup_ctx: the one ClientSession, with explicit timeouts and no decompression.

    It keeps no cookies: the session is shared by every client, so a cookie set in one
    client's answer (by the upstream, or a sticky load balancer before it) must reach that
    client only, never ride along with anyone else's request. Cookies pass through as
    headers, both ways."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        timeout = aiohttp.ClientTimeout(
            total=None, connect=settings.connect_timeout, sock_read=settings.read_timeout
        )
        connector = aiohttp.TCPConnector(
            limit=settings.upstream_connections, keepalive_timeout=settings.upstream_keepalive
        )
        async with aiohttp.ClientSession(
            timeout=timeout,
            connector=connector,
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept"),
        ) as session:
            app[SESSION] = session
            yield

    return ctx


async def read_answer(upstream: aiohttp.ClientResponse, limit: int) -> tuple[bytes, bool]:
    """The upstream's answer read whole, ``(body, True)``, when it is at most ``limit``
    bytes; otherwise ``(the part read, False)`` as soon as that shows (its Content-Length,
    or more than ``limit`` bytes received), for the caller to pass on unread."""
    length = upstream.content_length
    if length is not None:
        return (await upstream.read(), True) if length <= limit else (b"", False)
    chunks: list[bytes] = []
    size = 0
    async for chunk in upstream.content.iter_any():
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            return b"".join(chunks), False
    return b"".join(chunks), True


def too_large(limit: int) -> str:
    """The problem recorded for an answer passed on unread."""
    return f"answer larger than {limit} bytes (--max-answer-bytes): passed on unread"


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
