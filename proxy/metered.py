"""Metered pass-through for the other endpoints that report usage (embeddings, classify,
pooling, completions, chat): the answer is vLLM's, the record is committed before the
response (or the final ``[DONE]`` of a stream) is released."""

from __future__ import annotations

import json
import time
from typing import Any

import aiohttp
from aiohttp import web

from proxy.metering import METER, Meter
from proxy.metrics import METRICS, upstream_failure
from proxy.records import OPERATIONS
from proxy.relay import abort
from proxy.sse import UsageScanner
from proxy.upstream import SESSION, UpstreamError, exchange, response_headers

METERED_PATHS = frozenset(p for p, op in OPERATIONS.items() if op not in ("score", "rerank"))
STREAMING_OPERATIONS = frozenset({"chat", "completions"})


def ask_for_stream_usage(path: str, body: bytes) -> tuple[bytes, bool, str | None]:
    """(body to send, whether to strip the usage chunk, model) for one request.

    A streamed chat/completion that did not ask for ``stream_options.include_usage`` gets
    it added, so the stream can be metered; the client then never sees that chunk.
    """
    try:
        payload: Any = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return body, False, None
    if not isinstance(payload, dict):
        return body, False, None
    model = payload.get("model") if isinstance(payload.get("model"), str) else None
    if OPERATIONS.get(path) not in STREAMING_OPERATIONS or payload.get("stream") is not True:
        return body, False, model
    options = payload.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return body, False, model
    options = dict(options) if isinstance(options, dict) else {}
    options["include_usage"] = True
    return json.dumps({**payload, "stream_options": options}).encode(), True, model


def _tokens(usage: Any, key: str) -> int | None:
    value = usage.get(key) if isinstance(usage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class MeteredRelay:
    def __init__(self, upstream_base: str, version: Any) -> None:
        self._base = upstream_base
        self._version = version

    async def handle(self, request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        meter = request.app[METER]
        request_id = meter.request_id(request.headers)
        body, strip, model = ask_for_stream_usage(request.path, await request.read())
        try:
            async with exchange(request.app[SESSION], self._base, request, body) as upstream:
                if upstream.content_type == "text/event-stream":
                    return await self._stream(
                        request, upstream, meter, strip, model, request_id, started
                    )
                payload = await upstream.read()
                status, headers = upstream.status, upstream.headers
        except UpstreamError as exc:
            return upstream_failure(request, exc)
        reply = web.Response(
            body=payload, status=status, headers=response_headers(headers, keep_length=False)
        )
        usage = _usage_of(payload) if 200 <= status < 300 else None
        if usage is not None:
            journaled = await self._record(
                meter, request, request_id, usage, model, status, started
            )
            reply.headers.update(meter.headers(journaled, _tokens(usage, "total_tokens")))
        return reply

    async def _stream(
        self,
        request: web.Request,
        upstream: Any,
        meter: Meter,
        strip: bool,
        model: str | None,
        request_id: str,
        started: float,
    ) -> web.StreamResponse:
        reply = web.StreamResponse(
            status=upstream.status,
            reason=upstream.reason,
            headers=response_headers(upstream.headers, keep_length=False),
        )
        await reply.prepare(request)
        scanner = UsageScanner(strip=strip)
        try:
            async for chunk in upstream.content.iter_any():
                out = scanner.feed(chunk)
                if out:
                    await reply.write(out)
        except (aiohttp.ClientError, TimeoutError) as exc:
            abort(request, exc)  # an interrupted stream is not billed
            return reply
        tail = scanner.finish()
        if scanner.usage is not None:
            await self._record(
                meter, request, request_id, scanner.usage, model, upstream.status, started
            )
        await reply.write(tail + scanner.held)
        await reply.write_eof()
        return reply

    async def _record(
        self,
        meter: Meter,
        request: web.Request,
        request_id: str,
        usage: dict[str, Any],
        model: str | None,
        status: int,
        started: float,
    ) -> bool:
        prompt, completion = _tokens(usage, "prompt_tokens"), _tokens(usage, "completion_tokens")
        record = meter.new_record(
            request_id,
            meter.attribute(request.headers),
            request.path,
            model=model,
            upstream_version=self._version(),
            prompt_tokens_reported=prompt,
            prompt_tokens_billed=prompt,
            completion_tokens_reported=completion,
            completion_tokens_billed=completion,
            verdict="reported",
            status=status,
            latency_ms=round((time.perf_counter() - started) * 1000, 3),
        )
        request.app[METRICS].token_usage(record.operation, model or "unknown", prompt, completion)
        return await meter.record(record)


def _usage_of(payload: bytes) -> dict[str, Any] | None:
    try:
        parsed = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return None
    usage = parsed.get("usage") if isinstance(parsed, dict) else None
    return usage if isinstance(usage, dict) else None
