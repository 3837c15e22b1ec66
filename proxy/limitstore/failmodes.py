"""Local mode: each tenant's fail mode while the store cannot answer for its budgets
(unreachable, or rebuilding): ``closed`` refuses (503), ``open`` admits, ``local`` admits
by this replica's share in process (of what the store last said was left of each budget,
``remainders``, divided by ``divided``) and refuses what it cannot divide (no replica
count, no remainder), logged once and counted."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable

import structlog

from proxy.limits.limiter import Cost, Decision, Refusal, Ticket, Usage, Who
from proxy.limits.policy import FailMode, Policies
from proxy.limitstore.breaker import Breaker
from proxy.limitstore.divided import ShareLimiter
from proxy.limitstore.redislimiter import RedisLimiter
from proxy.limitstore.remainders import Remainders
from proxy.limitstore.tickets import LocalTicket
from proxy.metrics import Metrics

log = structlog.get_logger("proxy.limitstore.failmodes")

UNCOUNTED = (
    "the replica count is not known (it is read once a replica has stayed a whole registry "
    "TTL, 15 s, in a store that answers; set --limits-replicas to state it)"
)


class LocalMode:
    """Admission without the store, by each tenant's fail mode, and what it counted."""

    def __init__(
        self,
        shared: RedisLimiter,
        breaker: Breaker,
        fail_mode: FailMode,
        replicas: int,
        metrics: Metrics | None,
    ) -> None:
        self._shared = shared
        self._breaker = breaker  # its cooldown: when a refusal says to try again
        self.fail_mode = fail_mode  # the default, for tenants whose policy names none
        self._metrics = metrics
        self.replicas = max(replicas, 1)  # what local fail mode divides by
        self.remainders = Remainders(shared, lambda: self.replicas)
        self.local = ShareLimiter(
            shared.policies.divided(self.replicas),
            self.remainders.left_of,
            self.remainders.took_of,
            self.remainders.whole_of,
            shared.book.in_flight,
        )
        self.fail_admissions: dict[FailMode, int] = dict.fromkeys(FailMode, 0)
        self._warned: set[str] = set()  # limits local fail mode could not divide, logged
        self._stale = True  # the local budgets re-read this replica's usage on next use

    def replace(self, policies: Policies) -> None:
        self.local.replace(policies.divided(self.replicas))

    def set_replicas(self, replicas: int) -> None:
        """The replica count local fail mode divides by."""
        replicas = max(replicas, 1)
        if replicas != self.replicas:
            self.replicas = replicas
            self.local.replace(self._shared.policies.divided(replicas))

    def mode_of(self, who: Who) -> FailMode:
        return self._shared.policies.fail_mode(who.tenant, self.fail_mode)

    def heard(self) -> None:
        """The store answered a heartbeat: what could not be divided is logged again."""
        self._warned.clear()

    def reread(self) -> None:
        """This replica's usage billed through the store counts in its shares."""
        self._stale = True

    def billed(self, who: Who, billed: Cost, now: float) -> None:
        """A settlement through the store, counted in this replica's shares."""
        self.local.history.note(who, billed, now)
        self._stale = True

    async def restore(self, rows: Iterable[Usage], now: float) -> None:
        await self.local.restore(rows, now)

    async def admit(
        self, who: Who, cost: Cost, now: float, reason: str, *, counted: bool
    ) -> Decision:
        """The fail mode's decision; ``reason``: why the store did not decide
        (``unreachable``, or ``rebuilding``: its budgets not whole yet); ``counted``:
        whether this replica knows how many divide."""
        mode = self.mode_of(who)
        levels = self._shared.policies.levels(who.tenant, who.model, who.key)
        if mode is FailMode.LOCAL and not counted and any(x.limits for x in levels):
            # no share can be computed: dividing by what it saw may give it the whole budget
            return self._undivided(who, "replicas_unknown", UNCOUNTED)
        local = mode is FailMode.LOCAL
        if local and (undividable := self.remainders.undividable(levels, now)) is not None:
            scope, limit = undividable
            why = (
                f"this replica holds no remainder of {limit.name} of {':'.join(scope)} from "
                "the store to divide (a tenant it has not served, or the store found empty "
                "before it said what was left)"
            )
            return self._undivided(who, "no_remainder", why, f"{':'.join(scope)}:{limit.name}")
        self._count(mode, reason)
        if mode is FailMode.CLOSED:
            why = "the limits store is unreachable and this tenant's limits fail closed"
            return self._refused(who, why)
        if mode is FailMode.OPEN:
            return self._held(LocalTicket(who, cost, id=uuid.uuid4().hex), None, now)
        if self._stale:  # this replica's usage billed through the store counts here too
            self._stale = False
            await self.local.restore((), now)
        decision = await self.local.reserve(who, cost, now)
        if decision.ticket is None:
            return self._beyond_share(who, decision)
        ticket = LocalTicket(who, cost, id=uuid.uuid4().hex, inner=decision.ticket)
        return self._held(ticket, decision, now)

    def _count(self, mode: FailMode, reason: str) -> None:
        self.fail_admissions[mode] += 1
        if self._metrics is not None:
            self._metrics.fail_admissions.labels(mode.value, reason).inc()

    def _undivided(self, who: Who, reason: str, why: str, what: str = "") -> Decision:
        """Refused by local fail mode: a limit it cannot divide (logged once per reason
        and limit until the store answers again, counted every time)."""
        self._count(FailMode.LOCAL, reason)
        if (seen := f"{reason}:{what}") not in self._warned:
            self._warned.add(seen)
            log.warning("limits_local_refused", reason=reason, tenant=who.tenant, why=why)
        return self._refused(who, f"local fail mode cannot divide its limits: {why}")

    def _refused(self, who: Who, why: str) -> Decision:
        wait = max(self._breaker.cooldown, 1.0)  # a 503 always says when to try again
        scope = ("tenant", who.tenant)
        refusal = Refusal("limits_store", scope, wait, 0, 0, unavailable=True, why=why)
        return Decision(None, refusal, None, None)

    def _beyond_share(self, who: Who, decision: Decision) -> Decision:
        """A refusal by this replica's share quotes the whole limit; a request beyond the
        share but within the limit is refused for now (to retry once the store answers),
        not as one that can never be admitted."""
        refusal = decision.refusal
        if refusal is None or self.replicas <= 1:
            return decision
        whole = self.remainders.whole_named(refusal.scope, refusal.limit, refusal.amount)
        if refusal.alone and refusal.cost <= whole:  # within the whole: once the store is back
            refusal = dataclasses.replace(refusal, wait=self._breaker.cooldown, budget=False)
        refusal = dataclasses.replace(refusal, amount=whole)
        return dataclasses.replace(decision, refusal=refusal)

    def _held(self, ticket: LocalTicket, decision: Decision | None, now: float) -> Decision:
        """Admitted without the store: held in this process, and in the store from this
        replica's next contribution on."""
        seq, charged = self.remainders.admitted()
        ticket.held(seq, charged, [p for p in self._shared.parts(ticket.who, now) if p.kind != "r"])
        self._shared.book.hold(ticket)
        if decision is None:
            return Decision(ticket, None, None, None)
        return dataclasses.replace(decision, ticket=ticket)

    async def end(self, ticket: LocalTicket, billed: Cost | None, now: float) -> None:
        """A local admission ended: settled (``billed``) or released (None)."""
        ticket.end()
        self.remainders.ended(ticket.charged, billed)
        inner: Ticket | None = ticket.inner
        if inner is not None:
            if billed is not None:
                await self.local.settle(inner, billed, now)
            else:
                await self.local.release(inner, now)
        elif billed is not None:
            self.local.history.note(ticket.who, billed, now)
