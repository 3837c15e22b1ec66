"""Admission by exact cost: the one place a request's reservation is made (before it is
forwarded), refused in OpenAI's shape, told in ``x-ratelimit-*`` headers on every answer,
and settled to its record (or released) when its exchange ends.

The handlers call ``admit_scoring`` or ``admit_metered`` just before they forward; the
exchange owns the ``Hold`` and hands it to ``settle`` in its one ``finally``, so refusal,
upstream error, client disconnect and cancellation all end the reservation.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import structlog
from aiohttp import web
from pydantic import BaseModel, ConfigDict

from proxy.accounting.analysis import Analysis
from proxy.accounting.dispatch import Prepared
from proxy.ledger.journal import Journal
from proxy.limits.headers import duration, ratelimit_headers
from proxy.limits.limiter import Cost, Decision, Limiter, Usage, Who
from proxy.limits.memory import BUCKET_SECONDS
from proxy.limits.periods import earliest_start
from proxy.limits.pricing import Price, price_metered, price_scoring
from proxy.metrics import Metrics
from proxy.serving.catalog import Catalog
from proxy.serving.exchange import Exchange, Hold
from proxy.serving.upstream import error_response
from proxy.tokenizers.pool import TokenizerPool
from proxy.wire.jsonio import top_members

log = structlog.get_logger("proxy.serving.admission")
HOLD = web.RequestKey("limits_hold", Hold)


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: Any = None


class Admission:
    """Reservations against ``limiter`` for the exchanges of limited tenants."""

    def __init__(
        self,
        limiter: Limiter,
        catalog: Catalog,
        pool: TokenizerPool,
        metrics: Metrics,
        *,
        count_timeout: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.limiter = limiter
        self._catalog = catalog
        self._pool = pool
        self._metrics = metrics
        self._count_timeout = count_timeout
        self._clock = clock

    def applies(self, tenant: str) -> bool:
        """Whether any limit may apply to ``tenant`` (else nothing is reserved)."""
        policies = self.limiter.policies
        return tenant in policies.tenants or policies.default is not None

    async def admit_scoring(
        self, exchange: Exchange, counting: asyncio.Future[Analysis]
    ) -> web.Response | None:
        """A scoring request: for a tenant with a token limit, its recount (awaited here,
        before forwarding); else its request alone."""
        tenant = exchange.who.tenant
        if not self.applies(tenant):
            return None
        if not self.limiter.wants_tokens(tenant):
            return await self.admit(exchange, self._named(exchange.body), Price(Cost(), "none"))
        analysis = None
        try:
            async with asyncio.timeout(self._count_timeout):
                analysis = await asyncio.shield(counting)
        except Exception:  # priced as unpriced: admitted on its request limits alone
            log.warning("admission_count_failed", tenant=tenant, exc_info=True)
        model = analysis.model.name if analysis and analysis.model else self._named(exchange.body)
        return await self.admit(exchange, model, price_scoring(analysis))

    async def admit_metered(self, exchange: Exchange, prepared: Prepared) -> web.Response | None:
        """A metered request: priced in a tokenizer thread when a token limit applies."""
        tenant = exchange.who.tenant
        if not self.applies(tenant):
            return None
        served = self._catalog.lookup(prepared.model)
        model = served.name if served else prepared.model
        if not self.limiter.wants_tokens(tenant):
            return await self.admit(exchange, model, Price(Cost(), "none"))
        count_with = self._pool.copy_for(tenant)

        def price() -> Price:
            tok = served.tokenizer if served else None
            return price_metered(
                prepared.operation, prepared.body, served, count_with(tok) if tok else None
            )

        job = self._pool.lane(len(prepared.body)).submit_for(tenant, price)
        return await self.admit(exchange, model, await asyncio.wrap_future(job))

    async def admit(
        self, exchange: Exchange, model: str | None, price: Price
    ) -> web.Response | None:
        """Reserve ``price`` at every level that applies; the refusal to answer, if any."""
        who = Who(exchange.who.tenant, model, exchange.who.key_hash)
        decision = await self.limiter.reserve(who, price.cost, self._clock())
        exchange.hold.decision = decision
        exchange.request[HOLD] = exchange.hold
        for name, remaining in decision.budgets:
            self._metrics.budget_remaining.labels(name, *self._metrics.tenant(who.tenant)).set(
                remaining
            )
        if decision.refusal is None:
            return None
        return self._refuse(who, decision, price)

    def _refuse(self, who: Who, decision: Decision, price: Price) -> web.Response:
        refusal = decision.refusal
        assert refusal is not None
        self._metrics.limited.labels(refusal.limit, *self._metrics.tenant(who.tenant)).inc()
        log.info(
            "limited",
            tenant=who.tenant,
            model=who.model,
            limit=refusal.limit,
            scope=":".join(refusal.scope),
            cost=refusal.cost,
            amount=refusal.amount,
            wait_s=round(refusal.wait, 3),
            price=price.rule,
        )
        where = f"{refusal.limit} of {':'.join(refusal.scope)}"
        if refusal.unavailable:
            why = refusal.why or "the limits store cannot answer for this tenant's limits"
            return error_response(503, f"{why[0].upper()}{why[1:]}; please try again later.")
        if refusal.alone:
            why = (
                " It sets no completion cap, so its completion is priced at what the "
                "model's context leaves; set max_tokens (max_completion_tokens, "
                "max_output_tokens) to bound it."
                if price.uncapped
                else ""
            )
            return error_response(
                400,
                f"This request alone costs {refusal.cost}, more than the whole {where} "
                f"({refusal.amount}): it can never be admitted; reduce it.{why}",
            )
        kind = "requests" if refusal.limit.startswith(("requests", "concurrency")) else "tokens"
        body = {
            "error": {
                "message": f"Rate limit reached for {where}: limit {refusal.amount}, "
                f"requested {refusal.cost}. Please try again in {duration(refusal.wait)}.",
                "type": kind,
                "param": None,
                "code": "rate_limit_exceeded",
            }
        }
        return web.json_response(body, status=429)

    async def settle(self, hold: Hold) -> None:
        """The exchange ended: its reservation becomes what its record bills, or is given
        back when it has no record (refused, failed upstream, cancelled)."""
        ticket = hold.decision.ticket if hold.decision else None
        if ticket is None:
            return
        record, now = hold.record, self._clock()
        if record is None:
            await self.limiter.release(ticket, now)
            return
        billed = Cost(record.prompt_tokens_billed or 0, record.completion_tokens_billed or 0)
        await self.limiter.settle(ticket, billed, now)

    def _named(self, body: bytes) -> str | None:
        """The served model a body names (vLLM's default when it names none)."""
        try:
            found = top_members(body, _Model)
        except Exception:
            found = None
        named = found.get("model") if found else None
        return self._catalog.model_name(named if isinstance(named, str) else None)


ADMISSION = web.AppKey("admission", Admission)


async def add_headers(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: every answer of an admitted or refused request (plain,
    streamed, or the refusal itself) carries its limits' standing."""
    hold = request.get(HOLD)
    if hold is not None and hold.decision is not None:
        response.headers.update(ratelimit_headers(hold.decision))


def restore_context(
    admission: Admission, journal: Journal | None, metrics: Metrics
) -> Callable[[web.Application], AsyncIterator[None]]:
    """cleanup_ctx (after the journal opens): each budget's period usage rebuilt from the
    journal's records, so a restart does not reset a month."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        if journal is not None:
            now = time.time()
            start = earliest_start(now, admission.limiter.policies.zone)
            since = datetime.fromtimestamp(start, UTC)
            sums = await journal.usage_since(since, BUCKET_SECONDS)
            history = [
                Usage(
                    Who(s.tenant, s.model, s.key_hash),
                    float(s.start),
                    Cost(s.prompt, s.completion, s.records),
                )
                for s in sums
            ]
            await admission.limiter.restore(history, now)
            restored = sum(s.records for s in sums)
            metrics.limits_restored.inc(restored)
            log.info("budgets_restored", since=since.isoformat(), records=restored)
        yield

    return ctx
