"""Metered pass-through for the other endpoints that report usage (embeddings, classify,
pooling, completions, chat, and ``/invocations`` bodies that vLLM dispatches to them): the
answer is vLLM's, the record is committed before the response (or the final ``[DONE]`` of
a stream) is released."""

from __future__ import annotations

import time
from collections.abc import Awaitable
from typing import Any

import aiohttp
import structlog
from aiohttp import web

from proxy.catalog import CATALOG
from proxy.dispatch import Prepared, prepare
from proxy.encoding import UnreadableBody, content_codings
from proxy.exchanges import (
    handle_admitted,
    off_loop,
    read_answer,
    readable_body,
    reply_headers,
    too_large,
)
from proxy.metering import METER
from proxy.metrics import METRICS, upstream_failure
from proxy.records import OPERATIONS
from proxy.relay import (
    abort,
    client_left,
    pass_on_then_settle,
    pass_on_unread,
    send,
    write_now,
)
from proxy.sse import UsageScanner
from proxy.upstream import SESSION, UpstreamError, exchange, response_headers
from proxy.usage import Reading, read_usage, reading_of, usage_at_end

log = structlog.get_logger("proxy.metered")

METERED_PATHS = frozenset(p for p, op in OPERATIONS.items() if op not in ("score", "rerank"))
# Metered answers larger than this (below --max-answer-bytes) are not held either: they are
# passed on as they arrive and billed from the usage at their end, so a large batch of
# embeddings takes neither the proxy's memory nor the event loop's time to parse it
# (pydantic-core holds the GIL about 20 ms per 16 MB). Smaller ones are read whole, as a
# client reads them, and carry the x-usage-* headers.
HELD_ANSWER_BYTES = 8 * 1024 * 1024
# All the metered answers held whole at once: past it, one more is passed on the same way
# (billed from its end, without x-usage-* headers), so many clients fetching answers of a
# few MiB, or not reading them (for up to --send-timeout), cannot add up to gigabytes.
HELD_ANSWERS_TOTAL = 64 * 1024 * 1024


# A background Responses request is answered at once, queued, with no usage; the engine
# works on and the result is fetched later (GET /v1/responses/{id}, any number of times).
NOT_IN_THE_ANSWER = (
    "no usage in the answer (a background response): the engine's work is not billed"
)


class AnswerRoom:
    """Room for the metered answers held whole at once (``HELD_ANSWERS_TOTAL``)."""

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


class MeteredRelay:
    def __init__(self, upstream_base: str, max_answer_bytes: int) -> None:
        self._base = upstream_base
        self._limit = max_answer_bytes
        self.room = AnswerRoom(HELD_ANSWERS_TOTAL)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()

        async def work(body: bytes) -> web.StreamResponse:
            task_of = request.app[CATALOG].task_of
            prepared = await off_loop(prepare, body, request.path, body, task_of)
            return await self.relay(request, prepared, started)

        return await handle_admitted(request, work)

    async def relay(
        self, request: web.Request, prepared: Prepared, started: float
    ) -> web.StreamResponse:
        """Forward ``prepared`` and record the usage of a successful answer."""
        reserved = 0
        try:
            async with exchange(
                request.app[SESSION], self._base, request, prepared.body, metered=True
            ) as upstream:
                if upstream.content_type == "text/event-stream":
                    return await self._stream(request, upstream, prepared, started)
                encoded = bool(content_codings(upstream.headers.get("Content-Encoding")))
                if encoded:  # held to be decoded, up to the limit
                    held = self._limit
                else:
                    most = min(self._limit, HELD_ANSWER_BYTES)
                    held = reserved = self.room.take(upstream.content_length, most)
                payload, whole = await read_answer(upstream, held)
                status, headers = upstream.status, upstream.headers
                if not whole and encoded:  # its end cannot be read as it passes
                    unread = Reading(None, None, too_large(self._limit))
                    return await pass_on_unread(
                        request,
                        upstream,
                        payload,
                        lambda: self._settle(request, prepared, unread, status, started),
                    )
                if not whole:
                    self.room.give(reserved)
                    reserved = 0

                    def settle(end: bytes, aborted: bool) -> Awaitable[dict[str, str]]:
                        reading = _reading_at_end(end)
                        return self._settle(request, prepared, reading, status, started, aborted)

                    return await pass_on_then_settle(request, upstream, payload, settle)
            success = 200 <= status < 300
            try:
                payload = await readable_body(payload, headers, self._limit)
                out_headers = reply_headers(headers)
                reading = await off_loop(read_usage, payload, payload) if success else None
                if reading is None and success and prepared.operation == "responses":
                    reading = Reading(None, None, NOT_IN_THE_ANSWER)
            except UnreadableBody as exc:  # passed on as sent; recorded, billed nothing
                out_headers = response_headers(headers, keep_length=False)
                reading = Reading(None, None, f"unreadable answer: {exc}") if success else None
            reply = web.Response(body=payload, status=status, headers=out_headers)
            if reading is not None:
                reply.headers.update(
                    await self._settle(request, prepared, reading, status, started)
                )
            if reserved:  # written while its room is still taken
                await write_now(request, reply)
            return reply
        except UpstreamError as exc:
            return upstream_failure(request, exc)
        finally:
            self.room.give(reserved)

    async def _stream(
        self, request: web.Request, upstream: Any, prepared: Prepared, started: float
    ) -> web.StreamResponse:
        """Relay events as they come. A client that hangs up does not make the engine's
        work free: the upstream is read to its end and the record is marked aborted."""
        reply = web.StreamResponse(
            status=upstream.status,
            reason=upstream.reason,
            headers=response_headers(upstream.headers, keep_length=False),
        )
        await reply.prepare(request)
        scanner = UsageScanner(strip=prepared.strip_usage)
        client_gone = False
        try:
            async for chunk in upstream.content.iter_any():
                out = scanner.feed(chunk)
                if out and not client_gone:
                    client_gone = not await send(reply, out)
        except (aiohttp.ClientError, TimeoutError) as exc:
            abort(request, exc)  # an interrupted upstream stream is not billed
            return reply
        tail = scanner.finish()
        if client_gone:
            client_left(request, billed=scanner.usage is not None)
        reading = None
        if scanner.problem is not None:  # usage not known: billed nothing, never missing
            reading = Reading(None, None, scanner.problem)
        elif scanner.usage is not None:
            reading = reading_of(scanner.usage)
        if reading is not None and 200 <= upstream.status < 300:
            await self._settle(request, prepared, reading, upstream.status, started, client_gone)
        if client_gone:
            return reply
        if await send(reply, tail + scanner.held):
            await reply.write_eof()
        return reply

    async def _settle(
        self,
        request: web.Request,
        prepared: Prepared,
        reading: Reading,
        status: int,
        started: float,
        aborted: bool = False,
    ) -> dict[str, str]:
        """Record and journal one metered exchange; the headers its answer carries."""
        model = request.app[CATALOG].model_name(prepared.model)
        metrics = request.app[METRICS]
        if reading.problem:
            metrics.invalid_usage.labels(request.path).inc()
            log.warning("invalid_usage", path=request.path, problem=reading.problem)
        metrics.token_usage(
            prepared.operation, model or "unknown", reading.prompt, reading.completion
        )
        meter = request.app[METER]
        record = meter.new_record(
            request,
            prepared.operation,
            model=model,
            upstream_version=request.app[CATALOG].release.version,
            prompt_tokens_reported=reading.prompt,
            prompt_tokens_billed=reading.prompt,
            completion_tokens_reported=reading.completion,
            completion_tokens_billed=reading.completion,
            verdict="invalid" if reading.problem else "reported",
            status=status,
            aborted=aborted,
            latency_ms=round((time.perf_counter() - started) * 1000, 3),
        )
        journaled = await meter.record(record)
        return meter.headers(record, journaled)


METERED = web.AppKey("metered_relay", MeteredRelay)


def _reading_at_end(end: bytes) -> Reading:
    """The usage of an answer passed on as it came, from its last bytes (vLLM writes it
    last but for a few small members); invalid when it is not there."""
    usage = usage_at_end(end)
    if usage is None:
        problem = "answer passed on as it came (too large to hold, or no room), no usage at its end"
        return Reading(None, None, problem)
    return reading_of(usage)
