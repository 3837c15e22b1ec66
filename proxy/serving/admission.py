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
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from aiohttp import web

from proxy.accounting.analysis import Analysis
from proxy.accounting.dispatch import Prepared
from proxy.accounting.money import from_nanos, plain
from proxy.accounting.operations import FORM_OPERATIONS
from proxy.accounting.prices import PriceTable
from proxy.accounting.units import Quantities
from proxy.ledger.records import UsageRecord
from proxy.limits.costs import Unpriced, billed, reserved
from proxy.limits.headers import ratelimit_headers
from proxy.limits.limiter import Cost, Decision, Limiter, Ticket, Who
from proxy.limits.pricing import (
    NO_CONTEXT,
    UNPARSED,
    Price,
    parsed,
    price_metered,
    price_scoring,
)
from proxy.limits.speech import price_speech
from proxy.metrics import Metrics
from proxy.serving.bodies import off_loop
from proxy.serving.catalog import Catalog
from proxy.serving.exchange import Exchange, Hold
from proxy.serving.pricesfile import Prices
from proxy.serving.prompts import PromptCounter, asks, tokenizes
from proxy.serving.refusals import (
    NOT_COUNTED,
    NOT_IN_TIME,
    Refused,
    refused_by,
    retry_counted,
    stand_in,
    undiscovered,
    unreadable,
)
from proxy.serving.upstream import SESSION
from proxy.tokenizers.pool import FairExecutor, TokenizerPool

log = structlog.get_logger("proxy.serving.admission")
HOLD = web.RequestKey("limits_hold", Hold)


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
        prices: Prices | None = None,
        horizon: float = 600.0,
        prompts: PromptCounter | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.limiter = limiter
        self.catalog = catalog
        self._pool = pool
        self._metrics = metrics
        self._count_timeout = count_timeout
        self.prices = prices  # the money budgets' prices (cost_per_*)
        # how long after its admission a request's record may be made (--read-timeout): a
        # reservation is priced at the dearest price in force until then
        self._horizon = timedelta(seconds=horizon)
        self._clock = clock
        self._prompts = prompts  # generation prompts counted by the upstream's /tokenize

    @property
    def table(self) -> PriceTable | None:
        return self.prices.table if self.prices is not None else None

    def applies(self, tenant: str) -> bool:
        """Whether any limit may apply to ``tenant`` (else nothing is reserved)."""
        policies = self.limiter.policies
        return tenant in policies.tenants or policies.default is not None

    async def admit_scoring(
        self,
        exchange: Exchange,
        counting: asyncio.Future[Analysis],
        uncounted: Callable[[], Analysis],
    ) -> web.Response | None:
        """A scoring request: for a tenant with a token limit, its recount (awaited here,
        before forwarding); when that fails or does not come in time, the request read
        without counting (``uncounted``), priced at its bound; else its request alone."""
        tenant = exchange.who.tenant
        if not self.applies(tenant):
            return None
        if not self.limiter.wants_tokens(tenant):
            return await self.admit(
                exchange, self.catalog.named_in(exchange.body), Price(Cost(), "none")
            )
        if not await self.catalog.wait_ready(self._count_timeout):
            return self._undiscovered(exchange, self.catalog.named_in(exchange.body))
        analysis, late = None, ""
        try:
            if counting.done():  # counted from the count cache: no timer to arm
                analysis = counting.result()
            else:
                async with asyncio.timeout(self._count_timeout):
                    analysis = await asyncio.shield(counting)
        except Exception as exc:  # priced at its bound: every query and document at the context
            log.warning("admission_count_failed", tenant=tenant, exc_info=True)
            analysis = await self._read_uncounted(exchange.body, uncounted)
            late = NOT_IN_TIME if isinstance(exc, TimeoutError) else NOT_COUNTED
        analysis, widest = self.catalog.stand_in_for(analysis)
        priced = price_scoring(analysis)
        model = (
            analysis.model.name
            if analysis and analysis.model
            else self.catalog.named_in(exchange.body)
        )
        priced = replace(priced, late=late, note=stand_in(model) if widest else "")
        if priced.refusal is not None:
            who = Who(tenant, model, exchange.who.key_hash)
            return self._unpriced(who, unreadable(priced.refusal))
        return await self.admit(exchange, model, priced)

    @staticmethod
    async def _read_uncounted(body: bytes, uncounted: Callable[[], Analysis]) -> Analysis | None:
        """The request read without counting (off the loop when large); None when it
        cannot be (refused)."""
        try:
            return await off_loop(uncounted, body)
        except Exception:
            log.warning("admission_read_failed", exc_info=True)
            return None

    async def admit_metered(self, exchange: Exchange, prepared: Prepared) -> web.Response | None:
        """A metered request: priced in a tokenizer thread when a token limit applies."""
        tenant = exchange.who.tenant
        if not self.applies(tenant):
            return None
        served = self.catalog.lookup(prepared.model)
        model = served.name if served else prepared.model
        if not self.limiter.wants_tokens(tenant):
            return await self.admit(exchange, model, Price(Cost(), "none"))
        if not await self.catalog.wait_ready(self._count_timeout):
            return self._undiscovered(exchange, model)
        if prepared.operation in FORM_OPERATIONS:
            return await self._admit_speech(exchange, prepared)
        count_with = self._pool.copy_for(tenant)
        lane = self._pool.lane(len(prepared.body))

        priced_as = self.catalog.priced_as(prepared.model)

        def price(payload: Any = UNPARSED, counted: int | None = None) -> Price:
            tok = served.tokenizer if served else None
            return price_metered(
                prepared.operation,
                prepared.body,
                priced_as,
                count_with(tok) if tok else None,
                counted_prompt=counted,
                payload=payload,
            )

        def look() -> tuple[Any, Price | None]:
            """The body parsed, and its price when it has no prompt for /tokenize."""
            payload = parsed(prepared.body)
            return payload, None if tokenizes(prepared.operation, payload) else price(payload)

        if served and self._prompts is not None and asks(prepared.operation):
            # parsed once, in a worker thread, for the count and the price; a body with no
            # prompt to count (a pooling request of inputs) is priced in the same step
            payload, priced = await asyncio.wrap_future(lane.submit_for(tenant, look))
            if priced is None:
                counted = await self._count_prompt(exchange, prepared, payload, lane)
                job = lane.submit_for(tenant, price, payload, counted)
                priced = await asyncio.wrap_future(job)
        else:
            priced = await asyncio.wrap_future(lane.submit_for(tenant, price))
        if priced.refusal is not None:
            return self._unpriced(
                Who(tenant, model, exchange.who.key_hash), unreadable(priced.refusal)
            )
        if served is None and priced_as is not None:
            priced = replace(priced, note=stand_in(model))
        return await self.admit(exchange, model, priced)

    async def _count_prompt(
        self, exchange: Exchange, prepared: Prepared, payload: Any, lane: FairExecutor
    ) -> int | None:
        """A chat-like prompt's tokens as the upstream's /tokenize counts them (its work in
        the tenant's ``lane``), or None."""
        assert self._prompts is not None  # the caller asks only when prompts are counted
        request = exchange.request
        auth = request.headers.get("Authorization")

        async def offload(fn: Callable[[], Any]) -> Any:
            return await asyncio.wrap_future(lane.submit_for(exchange.who.tenant, fn))

        headers = {"Authorization": auth} if auth else {}
        release = self.catalog.release
        session = request.app[SESSION]
        return await self._prompts.count(session, prepared, payload, release, headers, offload)

    async def _admit_speech(self, exchange: Exchange, prepared: Prepared) -> web.Response | None:
        """An audio request: priced by its audio's duration, read from its file in a
        tokenizer thread (``limits.speech``); refused when that cannot be read."""
        served = self.catalog.priced_as(prepared.model)
        model = served.name if served else prepared.model
        kind = exchange.request.headers.get("Content-Type")
        lane = self._pool.lane(len(prepared.body))
        job = lane.submit_for(exchange.who.tenant, price_speech, prepared, kind, served)
        speech = await asyncio.wrap_future(job)
        if speech.refusal is not None:
            who = Who(exchange.who.tenant, model, exchange.who.key_hash)
            param = None if speech.refusal == NO_CONTEXT else "file"
            return self._unpriced(who, Refused(400, speech.refusal, final=True, param=param))
        return await self.admit(exchange, model, speech.price, units=speech.bills)

    async def admit_session(self, exchange: Exchange) -> web.Response | None:
        """A realtime session's opening: its request limits (and concurrency, held for its
        whole length), nothing else: each utterance is reserved at its commit. Under a
        token limit, before the first discovery it is refused as any request is (503)."""
        tenant = exchange.who.tenant
        if not self.applies(tenant):
            return None
        if self.limiter.wants_tokens(tenant) and not await self.catalog.wait_ready(
            self._count_timeout
        ):
            return self._undiscovered(exchange, None)
        exchange.hold.settled_apart()  # its utterances settle its units (``settle_utterance``)
        model = self.catalog.model_name(None)
        return await self.admit(exchange, model, Price(Cost(), "a session"), units=Quantities())

    async def admit_utterance(self, exchange: Exchange, model: str | None) -> Ticket | str | None:
        """One utterance of a realtime session, at the commit that starts it: every token
        its generation can make (its prompt and completion within the model's context,
        each reserved at the context; the model priced as any request's:
        ``Catalog.priced_as``). The ticket to settle at its ``transcription.done``;
        why it is refused (the session ends); None when no limit applies."""
        tenant = exchange.who.tenant
        if not self.applies(tenant) or not self.limiter.wants_tokens(tenant):
            return None
        served = self.catalog.priced_as(model)
        name = served.name if served else self.catalog.model_name(model)
        who = Who(tenant, name, exchange.who.key_hash)
        context = served.max_model_len if served and served.max_model_len > 0 else None
        if context is None:
            return f"The model {name!r} has no known context to price an utterance by."
        price = Price(Cost(context, context, requests=0), "bound: an utterance at the context")
        now = self._clock()
        cost = self._with_money(who, price.cost, now)
        if isinstance(cost, Refused):
            return cost.message
        decision = await self.limiter.reserve(who, cost, now)
        if decision.refusal is not None:
            return self._refuse(who, decision, price).message
        assert decision.ticket is not None
        return decision.ticket

    async def settle_utterance(
        self, ticket: Ticket, usage: tuple[int, int] | None, hold: Hold | None = None
    ) -> None:
        """An utterance ended: its reservation becomes its ``transcription.done`` usage at
        the price in force now. Without one (it never finished, or its usage could not be
        read) its session's record bills nothing for it, so nothing is charged: the budget
        holds what the journal holds (a restart rebuilds it from the records), logged. What
        is charged is added to its session's ``hold`` (settled against its record)."""
        now = self._clock()
        if usage is None:
            log.warning("utterance_unbilled", tenant=ticket.who.tenant, model=ticket.who.model)
            await self.limiter.settle(ticket, Cost(), now)
            return
        prompt, completion = usage
        money, table = 0, self.table
        if table is not None:
            at = datetime.fromtimestamp(now, UTC)
            q = Quantities(prompt, completion)
            money = billed(table, ticket.who.model, q, at, ticket.cost.money)[0]
        bill = Cost(prompt, completion, 0, money)
        if hold is not None:
            hold.charged(bill)
        await self.limiter.settle(ticket, bill, now)

    async def release_utterance(self, ticket: Ticket) -> None:
        """An utterance vLLM did not start (it refused the commit): nothing billed."""
        await self.limiter.release(ticket, self._clock())

    async def admit(
        self,
        exchange: Exchange,
        model: str | None,
        price: Price,
        *,
        units: Quantities | None = None,
    ) -> web.Response | None:
        """Reserve ``price`` at every level that applies (its money: ``units``, by default
        its tokens, at the dearest price in force until its timeout); the refusal to
        answer, if any."""
        who = Who(exchange.who.tenant, model, exchange.who.key_hash)
        now = self._clock()
        cost = self._with_money(who, price.cost, now, units)
        if isinstance(cost, Refused):
            return cost.answer()
        decision = await self.limiter.reserve(who, cost, now)
        exchange.hold.decided(retry_counted(decision) if price.late else decision)
        exchange.request[HOLD] = exchange.hold
        for name, remaining in decision.budgets:
            left = float(from_nanos(remaining)) if name.startswith("cost_") else remaining
            self._metrics.budget_left(name, who.tenant, left)
        if decision.refusal is None:
            return None
        return self._refuse(who, decision, price).answer()

    def _with_money(
        self, who: Who, cost: Cost, now: float, units: Quantities | None = None
    ) -> Cost | Refused:
        """``cost`` with what it may cost in money when a money budget applies to ``who``
        (``units`` at the dearest price in force from now to its timeout); a refusal when
        it cannot be priced."""
        policies = self.limiter.policies
        if not policies.money_applies(who.tenant, who.model, who.key):
            return cost
        table = self.table
        at = datetime.fromtimestamp(now, UTC)
        priced: Cost | Unpriced = Unpriced(f"model {who.model!r} has no price in force")
        if table is not None:
            priced = reserved(cost, table, who.model, at, within=self._horizon, units=units)
        if isinstance(priced, Cost):
            return priced
        budget = next(
            limit.name
            for level in policies.levels(who.tenant, who.model, who.key)
            for limit in level.limits
            if limit.money
        )
        self._metrics.limited.labels(budget, *self._metrics.tenant(who.tenant)).inc()
        log.warning(
            "unpriced_request", tenant=who.tenant, model=who.model, budget=budget, why=priced.why
        )
        why = f"This request cannot be admitted under the {budget} budget: {priced.why}."
        return Refused(400, why, final=True)

    def _unpriced(self, who: Who, refused: Refused) -> web.Response:
        """A request whose cost cannot be known before it runs (a shape the pricing cannot
        read, an audio file whose duration cannot be read), under a limit that needs its
        price: it can never be admitted as it is (admitting it for a token would let its
        engine work go unbudgeted)."""
        self._metrics.limited.labels("unpriced", *self._metrics.tenant(who.tenant)).inc()
        log.info("unpriced_refused", tenant=who.tenant, model=who.model, why=refused.message)
        return refused.answer()

    def _undiscovered(self, exchange: Exchange, model: str | None) -> web.Response:
        """A request under a token limit before the first discovery, waited for as long as
        a count is: no model is known to price it by (it was priced as an unknown model's,
        one token, while the engine served it), so it is refused until one is (503)."""
        who = Who(exchange.who.tenant, model, exchange.who.key_hash)
        return self._unpriced(who, undiscovered(self.catalog.problem))

    def _said(self, nanos: int) -> str:
        table = self.table
        return f"{plain(from_nanos(nanos))} {table.currency if table else ''}".rstrip()

    def _refuse(self, who: Who, decision: Decision, price: Price) -> Refused:
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
        money = refusal.limit.startswith("cost_")
        said = self._said if money else str
        return refused_by(refusal, price.uncapped, said, price.note, late=price.late)

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
        if hold.apart:  # its units were settled apart (a session's utterances)
            # what its record bills beyond their charges (a generation not admitted; its
            # amount at the price at its time, after a rise) is charged with its request
            done = hold.settled
            more = Cost(
                max(0, (record.prompt_tokens_billed or 0) - done.prompt),
                max(0, (record.completion_tokens_billed or 0) - done.completion),
                money=max(0, self._money(record, ticket.who, 0) - done.money),
            )
            await self.limiter.settle(ticket, more, now)
            return
        money = self._money(record, ticket.who, ticket.cost.money)
        bill = Cost(record.prompt_tokens_billed or 0, record.completion_tokens_billed or 0)
        await self.limiter.settle(ticket, replace(bill, money=money), now)

    def _money(self, record: UsageRecord, who: Who, reserved: int) -> int:
        """What a record costs the money budgets: its units at the price in force at its
        time (``limits.costs.billed``); 0 without a price file. Kept for every tenant (a
        budget a reload adds counts this period's records), said when one applies."""
        table = self.table
        if table is None:
            return 0
        money, whole = billed(table, record.model, record.units.quantities(), record.time, reserved)
        if not whole and self.limiter.policies.money_applies(who.tenant, who.model, who.key):
            log.warning(
                "unpriced_record", record_id=record.record_id, model=record.model, charged=money
            )
        return money


ADMISSION = web.AppKey("admission", Admission)


async def add_headers(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: every answer of an admitted or refused request (plain,
    streamed, or the refusal itself) carries its limits' standing."""
    hold = request.get(HOLD)
    if hold is not None and hold.decision is not None:
        response.headers.update(ratelimit_headers(hold.decision))
