"""One exchange per metered request: created once its body is admitted, run as one task,
released in one ``finally``.

The task is the exchange's own, so a client that hangs up (or a handler cancelled at
shutdown) cannot cut it short: the upstream answer is still read and recorded. The live
set is also what the reconciler asks about (in flight, started, failed) and what shutdown
waits for.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from proxy.accounting.operations import Operation
from proxy.accounting.routes import Route
from proxy.ledger.records import Units, UsageRecord
from proxy.limits.limiter import Cost, Decision
from proxy.metrics import Metrics
from proxy.serving.attribution import WHO, client_request_id
from proxy.serving.bodies import BodyBudget, Refused
from proxy.serving.shares import TenantShares
from proxy.serving.tenancy import Attribution
from proxy.serving.tracing import trace_of
from proxy.serving.upstream import FORWARDED, served_path

NO_UNITS = Units()  # a record that bills in no unit beyond tokens (frozen: one serves all)


@dataclass(slots=True)
class Hold:
    """What the exchange holds of its tenant's limits: the admission's decision (with its
    reservation) and the record that settles it. Released or settled when it ends."""

    decision: Decision | None = None
    record: UsageRecord | None = None
    # Its record's units were settled apart (a realtime session's, utterance by utterance,
    # ``settled`` summing what they were charged): the record settles its request and what
    # it bills beyond them (a generation not admitted, a price that rose before its time).
    apart: bool = False
    settled: Cost = field(default_factory=lambda: Cost(requests=0))

    def decided(self, decision: Decision) -> None:
        """The admission's decision: its reservation is what the exchange holds."""
        self.decision = decision

    def settled_apart(self) -> None:
        """Its units are settled apart from its record (a realtime session's utterances)."""
        self.apart = True

    def charged(self, bill: Cost) -> None:
        """One of its units settled apart (an utterance) was charged ``bill``."""
        was = self.settled
        self.settled = Cost(
            was.prompt + bill.prompt, was.completion + bill.completion, 0, was.money + bill.money
        )


@dataclass(frozen=True, slots=True)
class Exchange:
    """A metered request whose body the proxy holds."""

    request: web.Request
    route: Route
    body: bytes
    reserved: int  # bytes of the body budget it holds until it ends
    started: float  # time.perf_counter() when it arrived
    who: Attribution
    hold: Hold = field(default_factory=Hold)

    @property
    def path(self) -> str:
        """The endpoint served: the normalized path (``proxy.wire.targets``)."""
        return served_path(self.request)

    @property
    def elapsed_ms(self) -> float:
        return (time.perf_counter() - self.started) * 1000

    def record(
        self,
        *,
        operation: Operation,
        model: str | None,
        upstream_version: str | None,
        prompt: Billing,
        completion: Billing,
        verdict: str,
        status: int,
        aborted: bool,
        instance: str,
        m: int | None = None,
        n: int | None = None,
        units: Units | None = None,
    ) -> UsageRecord:
        """The usage record of this exchange, with a fresh proxy-minted id (what settles
        its reservation), in the trace its request was sent upstream in."""
        trace = trace_of(self.request)
        self.hold.record = record = UsageRecord(
            client_request_id=client_request_id(self.request.headers),
            tenant=self.who.tenant,
            key_hash=self.who.key_hash,
            model=model,
            endpoint=self.path,
            operation=operation,
            upstream_version=upstream_version,
            prompt_tokens_reported=prompt.reported,
            prompt_tokens_billed=prompt.billed,
            completion_tokens_reported=completion.reported,
            completion_tokens_billed=completion.billed,
            verdict=verdict,
            m=m,
            n=n,
            status=status,
            aborted=aborted,
            latency_ms=round(self.elapsed_ms, 3),
            instance=instance,
            units=units or NO_UNITS,
            trace_id=trace.trace_id,
            traceparent=trace.traceparent,
        )
        return record


@dataclass(frozen=True, slots=True)
class Billing:
    """Tokens of one kind (prompt or completion): what the upstream reported, what is billed."""

    reported: int | None
    billed: int | None


Work = Callable[[Exchange], Awaitable[web.StreamResponse]]
Settle = Callable[[Hold], Awaitable[None]]


async def _nothing_held(hold: Hold) -> None:
    return None


class Exchanges:
    """The live exchanges, and admission into them."""

    def __init__(
        self,
        budget: BodyBudget,
        shares: TenantShares,
        metrics: Metrics,
        settle: Settle = _nothing_held,
    ) -> None:
        self.budget = budget
        self._settle = settle
        self._shares = shares
        self._metrics = metrics
        self._live: set[asyncio.Task[Any]] = set()
        self._quiet = asyncio.Event()
        self._quiet.set()
        self.started = 0
        self.failed = 0  # ended in an error after reaching the upstream
        self.refused = 0  # ended in an error the proxy gave without forwarding

    @property
    def in_flight(self) -> int:
        return len(self._live)

    async def quiet(self) -> None:
        await self._quiet.wait()

    async def serve(self, request: web.Request, route: Route, work: Work) -> web.StreamResponse:
        """Admit and read the body, then run ``work`` on the exchange in its own task."""
        started, who = time.perf_counter(), request[WHO]
        size = self.budget.reservation(request)
        refusal = None if self.budget.fits(size) else self.budget.busy(size)
        refusal = refusal or self._shares.hold(who.tenant, size)
        if refusal is not None:
            self._metrics.refused.labels(str(refusal.status)).inc()
            return refusal
        try:
            body, reserved = await self.budget.admit(request)
        except Refused as exc:
            self._shares.release(who.tenant, size)
            self._metrics.refused.labels(str(exc.response.status)).inc()
            return exc.response
        except BaseException:
            self._shares.release(who.tenant, size)
            raise
        return await self.run(Exchange(request, route, body, reserved, started, who), work)

    async def run(self, exchange: Exchange, work: Work) -> web.StreamResponse:
        """``work(exchange)`` in a task of its own, which the caller's cancellation does not
        reach; its reservation is released when it ends."""
        loop = asyncio.get_running_loop()
        outcome: asyncio.Future[web.StreamResponse] = loop.create_future()
        task = loop.create_task(self._run(exchange, work, outcome))
        self._live.add(task)
        self.started += 1
        self._quiet.clear()
        return await outcome

    async def _run(
        self, exchange: Exchange, work: Work, outcome: asyncio.Future[web.StreamResponse]
    ) -> None:
        """A cancelled caller cancels only ``outcome``; the exchange runs to its end."""
        status, answered = 500, False
        try:
            reply = await work(exchange)
            status, answered = reply.status, True
            if not outcome.done():
                outcome.set_result(reply)
        except asyncio.CancelledError:
            outcome.cancel()
            raise
        except BaseException as exc:
            if not outcome.done():
                outcome.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            try:
                await self._settle(exchange.hold)  # never suspends in-process
            finally:
                self._end(exchange, status, answered)

    def _end(self, exchange: Exchange, status: int, answered: bool) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._live.discard(task)
        self.budget.release(exchange.reserved)
        self._shares.release(exchange.who.tenant, exchange.reserved)
        if status >= 400 and answered and not exchange.request.get(FORWARDED):
            self.refused += 1  # the proxy's own answer: nothing reached the engine
        elif status >= 400:
            self.failed += 1
        if not self._live:
            self._quiet.set()

    async def finish(self, timeout: float) -> None:
        """Shutdown: let exchanges whose client left finish recording, bounded."""
        if self._live:
            await asyncio.wait(list(self._live), timeout=timeout)


EXCHANGES = web.AppKey("exchanges", Exchanges)
