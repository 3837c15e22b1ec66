"""I/O steps the audited and the metered paths share: admit and read the client's body,
run work that scales with a body off the event loop, make the upstream's answer readable,
and the answer's headers."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
import structlog
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.encoding import content_codings, decode_body
from proxy.metering import METER
from proxy.metrics import METRICS
from proxy.settler import SETTLER
from proxy.upstream import error_response, response_headers

log = structlog.get_logger("proxy.exchanges")
T = TypeVar("T")
# Below this many bytes, parsing inline costs less than a hop to a thread.
INLINE_BYTES = 64 * 1024
# After holding at least this much, give freed memory back to the system.
TRIM_AFTER_BYTES = 8 * 1024 * 1024


class Refused(Exception):
    """A body the proxy will not read now; ``response`` says why, in vLLM's shape."""

    def __init__(self, response: web.Response) -> None:
        super().__init__(response.text)
        self.response = response


class BodyBudget:
    """Admission for request bodies held in memory (audited and metered paths).

    The proxy parses and counts what it holds, at several times the body's size; a
    budget on the bytes held at once bounds its memory whatever clients send. Past it,
    503 with ``Retry-After``. Reading a body has a deadline, so a stalled upload cannot
    pin its reservation.
    """

    def __init__(self, limit: int, max_body: int, read_timeout: float) -> None:
        self.limit = limit
        self.max_body = max_body
        self.read_timeout = read_timeout
        self.held = 0
        self._peak = 0
        self._trims: set[asyncio.Future[None]] = set()

    async def admit(self, request: web.Request) -> tuple[bytes, int]:
        """Reserve room for the body and read it within the deadline; the caller releases
        the returned reservation. Raises Refused (503 over budget, 408 too slow)."""
        size = min(request.content_length or self.max_body, self.max_body)
        if self.held + size > self.limit and self.held > 0:
            raise Refused(self._busy(size))
        self.held += size
        self._peak = max(self._peak, self.held)
        try:
            body = await read_within(request, self.read_timeout)
        except TimeoutError:
            self.release(size)
            raise Refused(body_timeout(self.read_timeout)) from None
        except BaseException:
            self.release(size)
            raise
        return body, size

    def release(self, size: int) -> None:
        self.held -= size
        if self.held == 0 and self._peak >= TRIM_AFTER_BYTES:
            self._peak = 0
            self._trim()

    def _busy(self, size: int) -> web.Response:
        log.warning("body_budget_exhausted", held=self.held, asked=size, limit=self.limit)
        reply = error_response(
            503,
            f"the proxy holds {self.held >> 20} MiB of request bodies; this one "
            f"({size >> 20} MiB) does not fit in --max-inflight-body-bytes now, retry",
        )
        reply.headers["Retry-After"] = "1"
        return reply

    def _trim(self) -> None:
        """Return freed heap pages to the system (glibc keeps them otherwise)."""
        trim = _malloc_trim()
        if trim is None:
            return
        future = asyncio.get_running_loop().run_in_executor(None, trim, 0)
        self._trims.add(future)
        future.add_done_callback(self._trims.discard)


async def read_within(request: web.Request, seconds: float) -> bytes:
    """The whole body, received within ``seconds`` (TimeoutError otherwise)."""
    if request.content.is_eof():  # already received in full: no deadline task needed
        return await request.read()
    return await asyncio.wait_for(request.read(), seconds)


def body_timeout(seconds: float) -> web.Response:
    """408 for a body that did not arrive in time; the connection is closed after it."""
    reply = error_response(408, f"request body not received within {seconds:g} s")
    reply.force_close()
    return reply


@functools.cache
def _libc() -> Any:
    """The C library, looked up once (find_library runs ldconfig: about 2 ms)."""
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name else None


def _malloc_trim() -> Callable[[int], Any] | None:
    return getattr(_libc(), "malloc_trim", None)


M_MMAP_THRESHOLD, M_ARENA_MAX = -3, -8


def tune_allocator() -> None:
    """glibc: serve buffers above 256 KiB (bodies, parsed documents) from their own
    mappings, returned to the system when freed, and keep two arenas instead of one per
    thread. Measured (bench/memory.py): after a 60 MiB body and 10 stalled uploads the
    proxy is back within 6 MB of idle instead of +110 MB. Call before threads start."""
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, 256 * 1024)
        mallopt(M_ARENA_MAX, 2)


BODIES = web.AppKey("body_budget", BodyBudget)


async def handle_admitted(
    request: web.Request, work: Callable[[bytes], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Admit and read the body, then run ``work(body)`` shielded from a client hang-up
    (``Meter.shielded``); the body's reservation is held until the work is done."""
    budget = request.app[BODIES]
    try:
        body, size = await budget.admit(request)
    except Refused as exc:
        request.app[METRICS].refused.labels(str(exc.response.status)).inc()
        return exc.response

    settler = request.app[SETTLER]

    async def held() -> web.StreamResponse:
        settler.begin()
        status = 500
        try:
            response = await work(body)
            status = response.status
            return response
        finally:
            settler.end(status)
            budget.release(size)

    return await request.app[METER].shielded(held())


async def off_loop(fn: Callable[..., T], body: bytes, *args: Any) -> T:
    """``fn(*args)`` in a worker thread when ``body`` is large, inline when small."""
    if len(body) < INLINE_BYTES:
        return fn(*args)
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


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
