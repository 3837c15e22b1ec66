"""The shared limiter as admission uses it: behind a short timeout and a circuit breaker,
with each tenant's fail mode while the store cannot answer for the budgets (unreachable,
or rebuilding after it was found empty), this replica's heartbeat in the store, and its
contribution of its journal to the store's budgets. ``wiring`` builds it.

Local fail mode divides; it never multiplies. A replica admits by its share only when it
knows both what to divide and by how many: the replica count (``--limits-replicas``, else
the live count of the last heartbeat the store answered once this replica had stayed a
whole registry TTL in it, so that every replica that stayed as long is in the count, or
the count it read before it restarted) and, for a budget, what the store last told it was
left of it (or the whole amount for a period that began after the store last answered
it). A limit it cannot divide refuses (503), logged and counted.

The guard holds its collaborators, each with its own state: the store calls with the
breaker (``calls``), the missed ends sent again (``replay``), this replica's contribution
(``contribution``) and heartbeat (``heartbeat``), and local mode, the fail modes with the
remainders they divide (``failmodes``, ``remainders``); here, admission and the ends of
reservations, which weave them together."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable

import structlog

from proxy.limits.limiter import (
    Cost,
    Decision,
    Lifetime,
    LimitStanding,
    StandingUnknown,
    Ticket,
    Usage,
    Who,
)
from proxy.limits.policy import FailMode, Policies
from proxy.limitstore.breaker import Breaker
from proxy.limitstore.calls import StoreCalls
from proxy.limitstore.client import STORE_ERRORS
from proxy.limitstore.contribution import Contribution
from proxy.limitstore.failmodes import LocalMode
from proxy.limitstore.headcount import CountFile
from proxy.limitstore.heartbeat import Heartbeat
from proxy.limitstore.redislimiter import RedisLimiter
from proxy.limitstore.replay import Replay, operation
from proxy.limitstore.tickets import LocalTicket, Rebuilding, StoreTicket, Taken
from proxy.limitstore.upkeep import RENEWALS_PER_TTL, store_lifetime
from proxy.metrics import Metrics

log = structlog.get_logger("proxy.limitstore.guard")

NOTHING = Cost(0, 0, 0)
INLINE_ENDS = 8  # a tenant's missed ends sent before its admission; the rest in the background


def _before(deadline: float) -> None:
    """A round trip is only begun before the admission's deadline."""
    if asyncio.get_running_loop().time() >= deadline:
        raise TimeoutError


class GuardedLimiter:
    """The shared limiter behind a short timeout and a circuit breaker, with the fail
    mode of each tenant while the store cannot answer: ``closed`` refuses (503),
    ``open`` admits, ``local`` enforces this replica's share in process (of what the
    store last said was left of each budget, else of the limit: ``proxy.limitstore.divided``).
    What is billed meanwhile is contributed to the store when it answers again (as this
    replica's total: a retry counts nothing twice)."""

    shared_store = True

    def __init__(
        self,
        shared: RedisLimiter,
        *,
        timeout: float,
        fail_mode: FailMode,
        replicas: int = 0,
        breaker: Breaker | None = None,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        slots: int = 8,
        kept: CountFile | None = None,
    ) -> None:
        self.shared = shared
        self.calls = StoreCalls(timeout, breaker=breaker, metrics=metrics, clock=clock, slots=slots)
        self.replay = Replay(shared, self.calls)
        self.contribution = Contribution(shared, self.calls, metrics)
        self.mode = LocalMode(shared, self.calls.breaker, fail_mode, replicas, metrics)
        self.heartbeat = Heartbeat(
            shared,
            self.calls,
            self.contribution,
            self.mode,
            configured=replicas,
            metrics=metrics,
            kept=kept,
        )

    @property
    def policies(self) -> Policies:
        return self.shared.policies

    @policies.setter
    def policies(self, policies: Policies) -> None:
        self.replace(policies)

    def replace(self, policies: Policies) -> None:
        self.shared.replace(policies)
        self.mode.replace(policies)

    def wants_tokens(self, tenant: str) -> bool:
        return self.shared.wants_tokens(tenant)

    def problem(self) -> tuple[str, bool] | None:
        return self.heartbeat.problem()

    def lifetime(self, *, journaled: bool) -> Lifetime:
        return store_lifetime(self, journaled=journaled)

    def ready(self, *, journaled: bool) -> None:
        """The application starts: without a journal to restore, this replica's part is
        ready to contribute at once."""
        if not journaled:
            self.contribution.readied()

    def renewal(self) -> float:
        """How often the holds of requests in flight are extended."""
        return self.shared.reservation_ttl / RENEWALS_PER_TTL

    async def restore(self, history: Iterable[Usage], now: float) -> int:
        rows = list(history)
        await self.mode.restore(rows, now)
        taken = await self.shared.restore(rows, now)
        self.contribution.readied()
        self.contribution.soon()  # the store's budgets may be waiting for this replica's part
        return taken

    async def contribute(self, now: float | None = None) -> bool:
        """Contribute this replica's part of every budget to the store now; whether the
        store's budgets are whole."""
        return await self.contribution.contribute(now)

    async def beat(self, ttl: float) -> int | None:
        return await self.heartbeat.beat(ttl)

    async def renew(self) -> int | None:
        return await self.heartbeat.renew()

    async def reserve(self, who: Who, cost: Cost, now: float) -> Decision:
        """The store's decision within one ``timeout`` in all (a reservation, and on a
        store found empty this replica's contribution and a second try), else the fail
        mode's."""
        reason = "unreachable"
        calls = self.calls
        try:
            async with calls.slots:
                await asyncio.sleep(0)  # the tasks queued before this one run first
                deadline = asyncio.get_running_loop().time() + calls.timeout
                async with asyncio.timeout_at(deadline):  # from here: a slot held
                    decision, reason = await self._reserve_in_store(who, cost, now, deadline)
        except TimeoutError as exc:  # the round trips together outlasted the timeout
            calls.failed("reserve", exc)
            decision = None
        if decision is not None:
            return decision
        counted = self.heartbeat.counted_now()
        decision = await self.mode.admit(who, cost, now, reason, counted=counted)
        if isinstance(decision.ticket, LocalTicket):
            self.contribution.owe()  # the store learns of its holds by the next one
            if calls.reachable and not calls.breaker.open:  # rebuilding: at once
                self.contribution.soon()
        return decision

    async def _reserve_in_store(
        self, who: Who, cost: Cost, now: float, deadline: float
    ) -> tuple[Decision | None, str]:
        """The store's decision, or None and why the store did not decide (unreachable,
        or its budgets' generation incomplete: every tenant then has its fail mode). A
        reservation whose answer is lost is cancelled once the store answers again. The
        deadline is checked between round trips too (on Python 3.11 a timeout's cancel
        can be lost inside the client's own wait)."""
        remainders = self.mode.remainders
        for attempt in (0, 1):
            if not self.calls.allows():
                return None, "unreachable"
            if self.replay.missed:  # the tenant's ends the store missed free their holds first
                await self.replay.replay(who.tenant, INLINE_ENDS, deadline)
            _before(deadline)
            seq, left = remainders.seq, dict[str, tuple[int, float, Taken]]()
            ticket = self.shared.ticket(who, cost, now)
            try:
                decision = await self.calls.call(
                    "reserve", self.shared.reserve_ticket(ticket, left)
                )
            except Rebuilding as exc:
                self._back()
                self.contribution.told(False)
                if attempt or exc.contributed:
                    return None, "rebuilding"
                _before(deadline)
                await self.contribution.contribute()
            except STORE_ERRORS as exc:
                self.replay.miss(ticket, NOTHING, "cancel")
                self.calls.failed("reserve", exc)
                return None, "unreachable"
            except BaseException:  # cancelled (the admission's timeout, or shutdown)
                self.replay.miss(ticket, NOTHING, "cancel")
                raise
            else:
                self._back()
                self.contribution.told(True)
                remainders.remember(left, seq)
                if decision.ticket is not None and self.mode.mode_of(who) is FailMode.LOCAL:
                    self.mode.local.count_rates(who, cost, now)
                return decision, ""
        return None, "rebuilding"

    async def standing(self, tenant: str, now: float) -> list[LimitStanding]:
        """The store's reading (the same on every replica), within the timeout; nothing
        this replica holds alone stands in for it (``StandingUnknown``)."""
        calls = self.calls
        if calls.breaker.open:  # a read never takes the half-open try admission waits for
            raise StandingUnknown("the limits store is unreachable")
        try:
            async with calls.slots:  # the store's connections are admission's first
                return await calls.call("standing", self.shared.standing(tenant, now))
        except STORE_ERRORS as exc:
            raise StandingUnknown("the limits store did not answer") from exc

    def _back(self) -> None:
        """The store answered a request's call: this replica's usage counts in its shares
        again; when the store is back (or this replica owes it its part) the part is
        contributed, and the ends it missed are sent again."""
        self.mode.reread()
        contribution = self.contribution
        if self.calls.succeeded() or contribution.dirty:
            log.info("limits_store_back", dirty=contribution.dirty, missed=len(self.replay.missed))
            contribution.soon()
        self.replay.resume()

    async def settle(self, ticket: Ticket, billed: Cost, now: float) -> None:
        await self._end(ticket, billed, now, settle=True)

    async def release(self, ticket: Ticket, now: float) -> None:
        await self._end(ticket, NOTHING, now, settle=False)

    async def _end(self, ticket: Ticket, billed: Cost, now: float, *, settle: bool) -> None:
        if not ticket.open:
            return
        if isinstance(ticket, LocalTicket):
            await self._end_local(ticket, billed, now, settle=settle)
            return
        book = self.shared.book
        if settle:
            book.note(ticket, billed, now)
            self.mode.billed(ticket.who, billed, now)  # after an outage began: in its share
            self.mode.remainders.beyond_reserved(ticket, billed)
        mode = "settle" if settle else "release"
        orphan = isinstance(ticket, StoreTicket) and ticket.generation != self.shared.generation
        book.ended(ticket)  # else the store's reservation expires by its TTL
        if orphan:  # reserved in a store state that is gone: it was in this replica's part
            book.orphaned(ticket)  # its bill is, now
            mode = "late" if settle else mode
            self.contribution.owe()
        if await self._send(
            ticket, billed, mode, lambda: self._unconfirmed(ticket, billed, mode, settle)
        ):
            self._back()
            if orphan:
                self.contribution.soon()
            if settle and _crossed(ticket, now):
                # the store added it to the period it was reserved in; the journal bills
                # it in this one: this replica's part of it, at once
                self.contribution.owe()
                await self.contribution.contribute(now)

    def _unconfirmed(self, ticket: Ticket, billed: Cost, mode: str, settle: bool) -> None:
        """An end the store did not confirm: a settlement is in this replica's part from
        now on (contributed as its total) and sent again ``late``, a release again as it
        is (see RedisLimiter.finish)."""
        self.replay.miss(ticket, billed, "late" if settle else mode)
        if settle:  # its first sending may still land: the next contribution claims it
            self.shared.book.unconfirmed(ticket)
            self.contribution.owe()
        else:
            self.shared.book.orphaned(ticket)

    async def _end_local(
        self, ticket: LocalTicket, billed: Cost, now: float, *, settle: bool
    ) -> None:
        await self.mode.end(ticket, billed if settle else None, now)
        if settle:
            self.shared.book.history.note(ticket.who, billed, now)
        self.shared.book.unhold(ticket)  # billed now, or given back
        self.contribution.owe()
        if ticket.adopting:  # its holds in the store given back; its bill in the part
            mode = "late" if settle else "release"
            await self._send(ticket, NOTHING, mode, lambda: self.replay.miss(ticket, NOTHING, mode))
        if self.calls.allows():
            self.contribution.soon()

    async def _send(
        self, ticket: Ticket, billed: Cost, mode: str, keep: Callable[[], None]
    ) -> bool:
        """Send an end to the store now; whether it got there. Else (the breaker skips the
        store, the call failed, or it was cancelled: shutdown) ``keep`` keeps it to send
        again."""
        if self.calls.allows():
            try:
                async with self.calls.slots:
                    await self.calls.call(operation(mode), self.shared.finish(ticket, billed, mode))
            except STORE_ERRORS as exc:
                self.calls.failed(operation(mode), exc)
            except BaseException:
                keep()
                raise
            else:
                return True
        keep()
        return False

    async def close(self) -> None:
        await self.contribution.close()
        await self.replay.close()
        await self.shared.close()


def _crossed(ticket: Ticket, now: float) -> bool:
    """Whether a store reservation is settled after a budget period it was reserved in
    ended (a stream across midnight)."""
    if not isinstance(ticket, StoreTicket):
        return False
    return any(p.kind == "b" and not p.start <= now < p.span for p in ticket.parts)
