"""The audited scoring path: read body, forward, count, reconcile, respond, log.

Counting starts as soon as the body is read and runs in the tokenizer pool while the
upstream works. Any failure in auditing leaves vLLM's answer untouched (``unaudited``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import structlog
from aiohttp import web

from proxy.analysis import (
    MIN_BYTES_PER_ITEM,
    Analysis,
    analyse,
    analyse_cached,
    decide,
    over_limit,
    wants_full_recount,
)
from proxy.catalog import Catalog
from proxy.encoding import UnreadableBody
from proxy.exchanges import (
    INLINE_BYTES,
    handle_admitted,
    off_loop,
    read_answer,
    readable_body,
    reply_headers,
    too_large,
)
from proxy.metering import METER, WHO, Meter
from proxy.metrics import METRICS, Metrics, upstream_failure
from proxy.reconcile import Audit, invalid, unaudited
from proxy.records import OPERATIONS, UsageRecord
from proxy.relay import pass_on_unread
from proxy.settings import Mode, Settings
from proxy.tenancy import Attribution
from proxy.tokenizer import TokenizerPool
from proxy.types import Verdict
from proxy.upstream import SESSION, UpstreamError, error_response, exchange, response_headers
from proxy.usage import Span, UsageView, annotate_usage, find_usage, rewrite_usage

log = structlog.get_logger("proxy.audit")

HEADER_ENGINE = "x-usage-engine-prompt-tokens"
HEADER_UPSTREAM = "x-usage-upstream-prompt-tokens"
HEADER_VERDICT = "x-usage-verdict"


def render(mode: Mode, view: UsageView, audit: Audit, raw: bytes) -> bytes:
    """The body the client receives in each output mode."""
    if mode is Mode.REWRITE and audit.verdict.value == "corrected" and audit.engine is not None:
        return rewrite_usage(view, audit.engine)
    if mode is Mode.ANNOTATE and view.problem is None:
        return annotate_usage(view, audit.engine, audit.verdict.value)
    return raw


def _finished(counting: asyncio.Future[Analysis]) -> Analysis | None:
    """The analysis, if counting completed successfully."""
    if counting.done() and not counting.cancelled() and counting.exception() is None:
        return counting.result()
    return None


def usage_headers(audit: Audit) -> dict[str, str]:
    headers = {HEADER_VERDICT: audit.verdict.value}
    if audit.reported is not None:
        headers[HEADER_UPSTREAM] = str(audit.reported)
    if audit.engine is not None:
        headers[HEADER_ENGINE] = str(audit.engine)
    return headers


class ScoringAuditor:
    """aiohttp handler for /score, /rerank (all aliases) and /invocations."""

    def __init__(self, settings: Settings, catalog: Catalog, pool: TokenizerPool) -> None:
        self._settings = settings
        self._catalog = catalog
        self._pool = pool

    async def handle(self, request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()

        async def work(body: bytes) -> web.StreamResponse:
            return await self.audit(request, body, started)

        return await handle_admitted(request, work)

    async def audit(
        self,
        request: web.Request,
        body: bytes,
        started: float,
        operation: str | None = None,
    ) -> web.StreamResponse:
        """Forward ``body``, recount it meanwhile, judge and record the answer."""
        await self._catalog.wait_ready(self._settings.accounting_timeout)
        loop = asyncio.get_running_loop()
        if len(body) >= MIN_BYTES_PER_ITEM * self._settings.max_documents:
            refusal = await loop.run_in_executor(
                self._pool.executor, over_limit, body, request.path, self._settings.max_documents
            )
            if refusal:
                return error_response(400, refusal, param="documents")
        counting = self._count(body, request.path)
        sent = time.perf_counter()
        limit = self._settings.max_answer_bytes
        try:
            async with exchange(
                request.app[SESSION], self._settings.upstream_base, request, body, metered=True
            ) as upstream:
                payload, whole = await read_answer(upstream, limit)
                if not whole:
                    analysis = _finished(counting)
                    counting.cancel()
                    outcome = Outcome(
                        request.path,
                        operation or OPERATIONS.get(request.path, "score"),
                        request[WHO],
                        invalid(too_large(limit)),
                        analysis,
                        upstream.status,
                        (time.perf_counter() - sent) * 1000,
                        started,
                    )
                    return await pass_on_unread(
                        request, upstream, payload, lambda: self._settle(request, outcome)
                    )
                status, headers = upstream.status, upstream.headers
        except UpstreamError as exc:
            counting.cancel()
            return upstream_failure(request, exc)
        upstream_ms = (time.perf_counter() - sent) * 1000
        try:
            payload = await readable_body(payload, headers, limit)
        except UnreadableBody as exc:
            problem: str | None = f"unreadable answer: {exc}"
            view = UsageView("", Span(0, 0), {}, None, problem) if 200 <= status < 300 else None
            out_headers = response_headers(headers, keep_length=False)
        else:
            view = await off_loop(find_usage, payload, payload) if 200 <= status < 300 else None
            out_headers = reply_headers(headers)
        if view is None:
            counting.cancel()
            return web.Response(body=payload, status=status, headers=out_headers)
        audit = await self._audit(counting, view)
        out = render(self._settings.mode, view, audit, payload)
        reply = web.Response(body=out, status=status, headers=out_headers)
        outcome = Outcome(
            request.path,
            operation or OPERATIONS.get(request.path, "score"),
            request[WHO],
            audit,
            _finished(counting),
            status,
            upstream_ms,
            started,
        )
        reply.headers.update(await self._settle(request, outcome))
        return reply

    async def _settle(self, request: web.Request, outcome: Outcome) -> dict[str, str]:
        """Record, log and measure one audited exchange; the headers its answer carries."""
        meter = request.app[METER]
        record = self._record(request, meter, outcome)
        journaled = await meter.record(record)
        _log(outcome, record.record_id)
        _observe(request.app[METRICS], outcome)
        return {**usage_headers(outcome.audit), **meter.headers(record, journaled)}

    def _count(self, body: bytes, path: str) -> asyncio.Future[Analysis]:
        """Count the request: from the count cache right here when the body is small and
        every text was seen before, else in the tokenizer pool while the upstream works."""
        loop = asyncio.get_running_loop()
        full = wants_full_recount(self._settings.recount_fraction)
        if len(body) < INLINE_BYTES:
            try:
                cached = analyse_cached(body, path, self._catalog, full)
            except Exception:  # e.g. a text no cache key can be made of: the pool judges it
                cached = None
            if cached is not None:
                done = loop.create_future()
                done.set_result(cached)
                return done
        return loop.run_in_executor(
            self._pool.lane(len(body)), analyse, body, path, self._catalog, self._pool, full
        )

    def _record(self, request: web.Request, meter: Meter, o: Outcome) -> UsageRecord:
        transport = request.transport
        return meter.new_record(
            request,
            o.operation,
            model=o.model,
            upstream_version=self._catalog.release.version,
            prompt_tokens_reported=o.audit.reported,
            prompt_tokens_billed=o.audit.billed,
            completion_tokens_reported=0,
            completion_tokens_billed=0,
            verdict=o.audit.verdict.value,
            m=o.m,
            n=o.n,
            status=o.status,
            aborted=transport is None or transport.is_closing(),
            latency_ms=round(o.elapsed_ms, 3),
        )

    async def _audit(self, counting: asyncio.Future[Analysis], view: UsageView) -> Audit:
        try:
            if counting.done():
                analysis = counting.result()
            else:
                analysis = await asyncio.wait_for(
                    asyncio.shield(counting), self._settings.accounting_timeout
                )
            return decide(analysis, view.reported, view.problem)
        except TimeoutError:
            if view.problem is not None:
                return invalid(view.problem)
            return unaudited("accounting timed out", view.reported)
        except Exception as exc:  # auditing must never break serving
            log.exception("accounting_failed")
            return unaudited(f"accounting failed: {type(exc).__name__}", view.reported)


@dataclass(frozen=True, slots=True)
class Outcome:
    """One audited exchange, as recorded, logged and measured."""

    path: str
    operation: str
    who: Attribution
    audit: Audit
    analysis: Analysis | None
    status: int
    upstream_ms: float
    started: float

    @property
    def model(self) -> str | None:
        """The served name (vLLM's default model when the request names none)."""
        if self.analysis is None:
            return None
        if self.analysis.model is not None:
            return self.analysis.model.name
        return self.analysis.request.model if self.analysis.request else None

    @property
    def m(self) -> int | None:
        scoring = self.analysis.request if self.analysis else None
        return len(scoring.queries) if scoring else None

    @property
    def n(self) -> int | None:
        scoring = self.analysis.request if self.analysis else None
        return len(scoring.documents) if scoring else None

    @property
    def elapsed_ms(self) -> float:
        return (time.perf_counter() - self.started) * 1000


def _log(o: Outcome, record_id: str) -> None:
    if not log.is_enabled_for(logging.INFO):  # skip building the fields nobody reads
        return
    log.info(
        "audited",
        record_id=record_id,
        model=o.model,
        endpoint=o.path,
        m=o.m,
        n=o.n,
        reported=o.audit.reported,
        engine=o.audit.engine,
        billed=o.audit.billed,
        verdict=o.audit.verdict.value,
        method=o.audit.method.value,
        reason=o.audit.reason,
        upstream_ms=round(o.upstream_ms, 2),
        accounting_ms=round(o.analysis.accounting_ms, 2) if o.analysis else None,
        total_ms=round(o.elapsed_ms, 2),
    )


def _observe(metrics: Metrics, o: Outcome) -> None:
    model = o.model or "unknown"
    a = o.audit
    metrics.audited(
        o.path, model, a.verdict.value, o.who.tenant, a.reported, a.billed, a.over_reported
    )
    if a.verdict is Verdict.INVALID:
        metrics.invalid_usage.labels(o.path).inc()
    metrics.token_usage(o.operation, model, a.billed, None)
    if o.analysis:
        metrics.tokenization.observe(o.analysis.accounting_ms / 1000)
    metrics.added.observe(max(o.elapsed_ms - o.upstream_ms, 0.0) / 1000)
