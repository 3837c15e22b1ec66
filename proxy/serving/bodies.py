"""Request bodies held in memory: admitted within a budget, read within a deadline, and
work that scales with a body kept off the event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

import structlog
from aiohttp import web

from proxy.serving.allocator import malloc_trim
from proxy.serving.upstream import error_response

log = structlog.get_logger("proxy.serving.bodies")
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

    def reservation(self, request: web.Request) -> int:
        """The bytes a request's body is held at: its length, or the most it may be."""
        encoded = request.headers.get("Content-Encoding", "identity").lower() != "identity"
        sent = None if encoded else request.content_length
        return min(sent or self.max_body, self.max_body)

    async def admit(self, request: web.Request) -> tuple[bytes, int]:
        """Reserve room for the body and read it within the deadline; the caller releases
        the returned reservation. Raises Refused (503 over budget, 408 too slow).

        A body with a ``Content-Encoding`` is inflated as it is read (aiohttp decodes it,
        bounded by --max-body-bytes, past which the client gets 413): what it holds is its
        decoded size, unknown until read, so it reserves the most it may decode to."""
        size = self.reservation(request)
        if not self.fits(size):
            raise Refused(self.busy(size))
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

    def fits(self, size: int) -> bool:
        """Whether a body of ``size`` is admitted now (a lone body always is)."""
        return self.held + size <= self.limit or self.held == 0

    def busy(self, size: int) -> web.Response:
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
        trim = malloc_trim()
        if trim is None:
            return
        future = asyncio.get_running_loop().run_in_executor(None, trim, 0)
        self._trims.add(future)
        future.add_done_callback(self._trims.discard)


async def read_within(request: web.Request, seconds: float) -> bytes:
    """The whole body, received within ``seconds`` (TimeoutError otherwise)."""
    if request.content.is_eof():  # already received in full: no deadline task needed
        return await request.read()
    async with asyncio.timeout(seconds):
        return await request.read()


def body_timeout(seconds: float) -> web.Response:
    """408 for a body that did not arrive in time; the connection is closed after it."""
    reply = error_response(408, f"request body not received within {seconds:g} s")
    reply.force_close()
    return reply


async def off_loop(fn: Callable[..., T], body: bytes, *args: Any) -> T:
    """``fn(*args)`` in a worker thread when ``body`` is large, inline when small."""
    if len(body) < INLINE_BYTES:
        return fn(*args)
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)
