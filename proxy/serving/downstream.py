"""Writing to clients: the helpers every path shares to pass an upstream answer on, hold
its end until its record is committed, and notice a client that has gone."""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable

import aiohttp
import structlog
from aiohttp import web
from multidict import CIMultiDict

from proxy.ledger.records import UsageRecord
from proxy.metrics import Metrics
from proxy.serving.upstream import response_headers, served_path

log = structlog.get_logger("proxy.serving.downstream")

HEADER_RECORD = "x-usage-record"
HEADER_RECORD_ID = "x-usage-record-id"


class AnswerRoom:
    """Room for the metered answers held whole at once (``metered.HELD_ANSWERS_TOTAL``): an
    answer that finds none is passed on as it comes, not held."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.held = 0

    def take(self, length: int | None, most: int) -> int:
        """Bytes reserved to hold an answer of ``length`` (None: unknown, ``most`` is
        reserved) whole; 0 when it is not to be held: above ``most``, or no room now."""
        size = most if length is None else length
        if size > most or self.held + size > self.total:
            return 0
        self.held += size
        return size

    def give(self, size: int) -> None:
        self.held -= size


def record_headers(record: UsageRecord, journaled: bool) -> dict[str, str]:
    """The headers that tell the client which record bills its answer."""
    out = {HEADER_RECORD_ID: record.record_id}
    if not journaled:
        out[HEADER_RECORD] = "failed"
    return out


def abort(request: web.Request, exc: BaseException) -> None:
    """The upstream failed mid-body: cut the client connection so the truncation shows.

    Headers are already sent, so no error status is possible; a clean end of stream would
    pass a partial body off as complete.
    """
    log.warning("upstream_failed_mid_body", path=served_path(request), error=type(exc).__name__)
    if request.transport is not None:
        request.transport.close()


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
        log.warning("answer_passed_on_unread", path=served_path(request))
        headers.update(await settle())
    return await pass_on(request, upstream, head, headers)


# The end of an unread answer kept back until its record is committed: vLLM's usage, which
# ends the answer, is a few hundred bytes.
ANSWER_END_BYTES = 64 * 1024


async def pass_on_then_settle(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    head: bytes,
    settle: Callable[[bytes, bool], Awaitable[object]],
    metrics: Metrics,
    *,
    scan: Callable[[bytes], Awaitable[None]] | None = None,
) -> web.StreamResponse:
    """A metered answer too large to hold is passed on as it arrives, but for its last
    ANSWER_END_BYTES. A successful one is then settled with those last
    bytes, where its usage is, and whether the client left before its end (``settle(end,
    aborted)``), before they are released; the record's headers cannot ride on an answer
    already under way. A client that hangs up does not make the engine's work free: the
    upstream is read to its end all the same. An upstream failure mid-body cuts the client
    connection and settles nothing (an interrupted answer is not billed)."""
    headers = response_headers(upstream.headers, keep_length=True)
    reply = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=headers)
    await reply.prepare(request)
    end = _End(reply)
    try:
        if scan is not None:
            await scan(head)
        await end.add(head)
        async for chunk in upstream.content.iter_any():
            if scan is not None:  # e.g. the top-level usage, read as the answer passes
                await scan(chunk)
            await end.add(chunk)
    except (aiohttp.ClientError, TimeoutError) as exc:
        abort(request, exc)
        return reply
    last = end.bytes()
    if end.client_gone:
        client_left(request, metrics)
    if 200 <= upstream.status < 300:  # a usage not found there is logged as invalid_usage
        await settle(last, end.client_gone)
    if not end.client_gone and await send(reply, last):
        await reply.write_eof()
    return reply


class _End:
    """Writes what it is given to ``reply`` but for the last ANSWER_END_BYTES, which it
    holds (copying at most that many bytes per chunk); once the client has gone, it only
    keeps the end."""

    def __init__(self, reply: web.StreamResponse) -> None:
        self._reply = reply
        self._held: deque[bytes] = deque()
        self._size = 0
        self.client_gone = False

    async def add(self, chunk: bytes) -> None:
        self._held.append(chunk)
        self._size += len(chunk)
        excess = self._size - ANSWER_END_BYTES
        while excess > 0:
            first = self._held[0]
            if len(first) <= excess:
                self._held.popleft()
                out: bytes | memoryview = first
            else:
                out = memoryview(first)[:excess]
                self._held[0] = first[excess:]
            self._size -= len(out)
            excess -= len(out)
            if not self.client_gone:
                self.client_gone = not await send(self._reply, out)

    def bytes(self) -> bytes:
        return b"".join(self._held)


def client_left(request: web.Request, metrics: Metrics, **context: object) -> None:
    """A client hung up before its metered answer ended (it is still billed): logged and
    counted in usage_proxy_client_aborted_total."""
    log.info("client_disconnected", path=served_path(request), **context)
    metrics.aborted.labels(served_path(request)).inc()


# What a write raises once the client has gone (hung up, or cut by SendWatch).
CLIENT_GONE = (ConnectionError, aiohttp.ClientConnectionResetError)


async def send(reply: web.StreamResponse, data: bytes | memoryview) -> bool:
    """Write to the client; False when the client has gone away."""
    try:
        await reply.write(data)
    except CLIENT_GONE:
        return False
    return True


async def write_now(request: web.Request, reply: web.Response) -> None:
    """Write ``reply`` before the handler returns it (aiohttp would write it after), so
    what holds it can be let go once it has gone; a client that left is no error."""
    try:
        await reply.prepare(request)
        await reply.write_eof()
    except CLIENT_GONE:
        pass


async def pass_on(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    head: bytes,
    headers: CIMultiDict[str],
) -> web.StreamResponse:
    """Stream the upstream's answer to the client as it arrives: ``head`` (the part
    already read), then the rest. An upstream failure mid-body cuts the client
    connection; a client that hangs up ends the exchange (nothing here is metered)."""
    reply = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=headers)
    await reply.prepare(request)
    try:
        gone = bool(head) and not await send(reply, head)
        if not gone:
            async for chunk in upstream.content.iter_any():
                if not await send(reply, chunk):
                    gone = True
                    break
    except (aiohttp.ClientError, TimeoutError) as exc:
        abort(request, exc)
        return reply
    if gone:
        log.info("client_disconnected", path=served_path(request))
        return reply
    await reply.write_eof()
    return reply
