"""The audited scoring path: read body, forward, count, reconcile, respond, log.

Counting starts as soon as the body is read and runs in the tokenizer pool while the
upstream works. Any failure in auditing leaves vLLM's answer untouched (``unaudited``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from functools import partial

import structlog
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.accounting.analysis import (
    MIN_BYTES_PER_ITEM,
    Analysis,
    Lookup,
    analyse,
    analyse_cached,
    decide,
    in_full,
    over_limit,
    understand,
    wants_full_recount,
)
from proxy.accounting.operations import Operation
from proxy.accounting.proof import Change, Proofs, Standing
from proxy.accounting.shapes import score_ambiguity
from proxy.accounting.types import Verdict
from proxy.accounting.verdicts import Audit, invalid, unaudited
from proxy.ledger.recorder import Recorder
from proxy.ledger.records import UsageRecord
from proxy.metrics import Metrics
from proxy.serving.admission import Admission
from proxy.serving.bodies import INLINE_BYTES, off_loop
from proxy.serving.catalog import Catalog
from proxy.serving.downstream import pass_on_unread, record_headers
from proxy.serving.exchange import Billing, Exchange
from proxy.serving.upstream import (
    SESSION,
    UpstreamError,
    error_response,
    forward,
    read_answer,
    readable_body,
    reply_headers,
    response_headers,
    too_large,
    upstream_failure,
)
from proxy.settings import Mode, Settings
from proxy.tokenizers.hf import cached_for
from proxy.tokenizers.pool import TokenizerPool
from proxy.wire.encoding import UnreadableBody
from proxy.wire.usage import Span, UsageView, annotate_usage, find_usage, rewrite_usage

log = structlog.get_logger("proxy.serving.audited")

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
    """The handler for /score, /rerank (all aliases) and scoring bodies to /invocations."""

    def __init__(
        self,
        settings: Settings,
        catalog: Catalog,
        pool: TokenizerPool,
        recorder: Recorder,
        metrics: Metrics,
        admission: Admission | None = None,
    ) -> None:
        self._settings = settings
        self._base = settings.upstream_base  # read once: a pydantic URL made a string
        self._admission = admission
        self._catalog = catalog
        self._pool = pool
        self._recorder = recorder
        self._metrics = metrics
        self.proofs = Proofs(settings.trust_after_recounts)

    async def __call__(self, exchange: Exchange) -> web.StreamResponse:
        return await self.audit(exchange, exchange.route.operation)

    async def audit(
        self, exchange: Exchange, operation: Operation, lookup: Lookup | None = None
    ) -> web.StreamResponse:
        """Forward the body, recount it meanwhile, judge and record the answer. ``lookup``
        finds the served model when the body's ``model`` is not what vLLM goes by
        (``/invocations``)."""
        request, body = exchange.request, exchange.body
        await self._catalog.wait_ready(self._settings.accounting_timeout)
        refusal = await self._over_limit(body, exchange.path)
        if refusal:
            return error_response(400, refusal, param="documents")
        if exchange.route.operation == Operation.SCORE:
            unclear = await off_loop(score_ambiguity, body, body)
            if unclear is not None:
                self.refuse_unclear()
                return error_response(400, unclear)
        tenant = exchange.who.tenant
        priced = self._admission is not None and self._admission.limiter.wants_tokens(tenant)
        counting = self._count(body, exchange.path, tenant, lookup, exact=priced)
        if self._admission is not None:  # a tenant with a token limit waits for its count
            read = partial(understand, body, exchange.path, lookup or self._catalog.lookup)
            limited = await self._admission.admit_scoring(exchange, counting, read)
            if limited is not None:
                counting.cancel()
                return limited
        sent = time.perf_counter()
        limit = self._settings.max_answer_bytes
        try:
            async with forward(
                request.app[SESSION], self._base, request, body, metered=True
            ) as upstream:
                payload, whole = await read_answer(upstream, limit)
                if not whole:
                    analysis = _finished(counting)
                    counting.cancel()
                    outcome = Outcome(
                        exchange,
                        operation,
                        invalid(too_large(limit)),
                        analysis,
                        upstream.status,
                        (time.perf_counter() - sent) * 1000,
                    )
                    return await pass_on_unread(
                        request, upstream, payload, lambda: self._settle(outcome)
                    )
                status, headers = upstream.status, upstream.headers
        except UpstreamError as exc:
            counting.cancel()
            return upstream_failure(self._metrics, exc)
        upstream_ms = (time.perf_counter() - sent) * 1000
        view, payload, out_headers = await _usage_view(payload, headers, status, limit)
        if view is None:
            counting.cancel()
            return web.Response(body=payload, status=status, headers=out_headers)
        audit = await self._audit(counting, view)
        out = render(self._settings.mode, view, audit, payload)
        reply = web.Response(body=out, status=status, headers=out_headers)
        outcome = Outcome(exchange, operation, audit, _finished(counting), status, upstream_ms)
        reply.headers.update(await self._settle(outcome))
        return reply

    def refuse_unclear(self) -> None:
        """Count a body refused because which inputs vLLM reads is not the proxy's to guess."""
        self._metrics.refused.labels("400").inc()

    async def _over_limit(self, body: bytes, path: str) -> str | None:
        """A refusal when the body holds more than --max-documents inputs (only a body
        large enough to hold that many is parsed before forwarding)."""
        most = self._settings.max_documents
        if len(body) < MIN_BYTES_PER_ITEM * most:
            return None
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool.executor, over_limit, body, path, most)

    async def _settle(self, outcome: Outcome) -> dict[str, str]:
        """Record, log and measure one audited exchange; the headers its answer carries."""
        model = outcome.analysis.model if outcome.analysis else None
        if model is not None:
            change = self.proofs.observe(model, outcome.audit.verdict, outcome.audit.method)
            if change is not None:
                _standing_changed(self._metrics, change, outcome.audit)
        record = self._record(outcome)
        journaled = await self._recorder.record(record)
        _log(outcome, record.record_id)
        _observe(self._metrics, outcome)
        return {**usage_headers(outcome.audit), **record_headers(record, journaled)}

    def _count(
        self,
        body: bytes,
        path: str,
        tenant: str = "",
        lookup: Lookup | None = None,
        exact: bool = False,
    ) -> asyncio.Future[Analysis]:
        """Count the request (in full when ``exact``: admission prices it): from the count
        cache right here when the body is small and every text was seen before (by this
        tenant: the cache keeps tenants apart), else in the tokenizer pool while the
        upstream works."""
        loop = asyncio.get_running_loop()
        sampled = exact or wants_full_recount(self._settings.recount_fraction)
        full = in_full(sampled, self.proofs.trusted)
        lookup = lookup or self._catalog.lookup
        if len(body) < INLINE_BYTES:
            try:
                cached = analyse_cached(body, path, lookup, cached_for(tenant), full)
            except Exception:  # e.g. a text no cache key can be made of: the pool judges it
                cached = None
            if cached is not None:
                done = loop.create_future()
                done.set_result(cached)
                return done
        lane = self._pool.lane(len(body))
        count_with = self._pool.copy_for(tenant)
        job = lane.submit_for(tenant, analyse, body, path, lookup, count_with, full)
        return asyncio.wrap_future(job, loop=loop)

    def _record(self, o: Outcome) -> UsageRecord:
        transport = o.exchange.request.transport
        return o.exchange.record(
            operation=o.operation,
            model=o.model,
            upstream_version=self._catalog.release.version,
            prompt=Billing(o.audit.reported, o.audit.billed),
            completion=Billing(0, 0),
            verdict=o.audit.verdict.value,
            m=o.m,
            n=o.n,
            status=o.status,
            aborted=transport is None or transport.is_closing(),
            instance=self._settings.instance,
        )

    async def _audit(self, counting: asyncio.Future[Analysis], view: UsageView) -> Audit:
        try:
            if counting.done():
                analysis = counting.result()
            else:
                async with asyncio.timeout(self._settings.accounting_timeout):
                    analysis = await asyncio.shield(counting)
            return decide(analysis, view.reported, view.problem, self.proofs.trusted)
        except TimeoutError:
            if view.problem is not None:
                return invalid(view.problem)
            return unaudited("accounting timed out", view.reported)
        except Exception as exc:  # auditing must never break serving
            log.exception("accounting_failed")
            return unaudited(f"accounting failed: {type(exc).__name__}", view.reported)


AUDITOR = web.AppKey("auditor", ScoringAuditor)


async def _usage_view(
    payload: bytes, headers: CIMultiDictProxy[str], status: int, limit: int
) -> tuple[UsageView | None, bytes, CIMultiDict[str]]:
    """The usage of a successful answer (None for any other), its body decoded, and the
    headers it goes out with. An answer that cannot be decoded is passed on as sent."""
    success = 200 <= status < 300
    try:
        payload = await readable_body(payload, headers, limit)
    except UnreadableBody as exc:
        problem = f"unreadable answer: {exc}"
        view = UsageView("", Span(0, 0), {}, None, problem) if success else None
        return view, payload, response_headers(headers, keep_length=False)
    view = await off_loop(find_usage, payload, payload) if success else None
    return view, payload, reply_headers(headers)


@dataclass(frozen=True, slots=True)
class Outcome:
    """One audited exchange, as recorded, logged and measured."""

    exchange: Exchange
    operation: Operation
    audit: Audit
    analysis: Analysis | None
    status: int
    upstream_ms: float

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
        return self.exchange.elapsed_ms


def _log(o: Outcome, record_id: str) -> None:
    if not log.is_enabled_for(logging.INFO):  # skip building the fields nobody reads
        return
    log.info(
        "audited",
        record_id=record_id,
        model=o.model,
        endpoint=o.exchange.path,
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


def _standing_changed(metrics: Metrics, change: Change, audit: Audit) -> None:
    """A model became trusted with shortcuts, or a full recount disproved the proxy's
    reading of it (shortcuts off for it from now on: every request recounted)."""
    trusted = change.standing is Standing.TRUSTED
    metrics.shortcuts_trusted.labels(change.model).set(int(trusted))
    if trusted:
        log.info("model_proven", model=change.model, full_recounts_agreed=change.proofs)
        return
    metrics.recount_disagreements.labels(change.model).inc()
    log.warning(
        "model_distrusted",
        model=change.model,
        full_recounts_agreed_before=change.proofs,
        reported=audit.reported,
        engine=audit.engine,
        reason=audit.reason,
        consequence="every request of this model is recounted in full; shortcuts "
        "(--recount-fraction, formula verdicts) stay off until it is served anew",
    )


def _observe(metrics: Metrics, o: Outcome) -> None:
    model = o.model or "unknown"
    a = o.audit
    path = o.exchange.path
    metrics.audited(path, model, o.exchange.who.tenant, a)
    if a.verdict is Verdict.INVALID:
        metrics.invalid_usage.labels(path).inc()
    metrics.token_usage(o.operation, model, a.billed, None)
    if o.analysis:
        metrics.tokenization.observe(o.analysis.accounting_ms / 1000)
    metrics.added.observe(max(o.elapsed_ms - o.upstream_ms, 0.0) / 1000)
