"""Each tenant's fail mode while the store cannot answer for its budgets (unreachable, or
rebuilding): ``closed`` refuses (503), ``open`` admits, ``local`` admits by this replica's
share in process and refuses what it cannot divide (no replica count, no remainder),
logged once and counted; and what /readyz says of it."""

from __future__ import annotations

import dataclasses
import uuid

import structlog

from proxy.limits.limiter import Cost, Decision, Refusal, Who
from proxy.limits.periods import period
from proxy.limits.policy import FailMode, Level, Limit
from proxy.limitstore.heartbeat import Heartbeat
from proxy.limitstore.tickets import LocalTicket

log = structlog.get_logger("proxy.limitstore.failmodes")

UNCOUNTED = (
    "the replica count is not known (it is read once a replica has stayed a whole registry "
    "TTL, 15 s, in a store that answers; set --limits-replicas to state it)"
)


class FailModes(Heartbeat):
    """Admission without the store, by each tenant's fail mode."""

    def problem(self) -> tuple[str, bool] | None:
        """What /readyz reports about the store, and whether it fails readiness: when
        this replica refuses every limited request of the default fail mode while one
        that reaches the store (or can divide) would serve them. Unreachable: the last
        heartbeat failed or the breaker is open (one slow request is neither)."""
        local = self.fail_mode is FailMode.LOCAL
        if not self.beating or self.breaker.open:
            if self.fail_mode is FailMode.CLOSED:
                return "unreachable: limited tenants refused (fail mode closed)", True
            if local and not self._counted():
                return f"unreachable: limited tenants refused: {UNCOUNTED}", True
            if local:
                return (
                    "unreachable: limited tenants admitted by this replica's share of "
                    f"what the store last said was left of each limit (1/{self.replicas}; "
                    "a budget with no such remainder is refused)",
                    False,
                )
            return "unreachable: limited tenants admitted without limits (fail mode open)", False
        if self.generation is not None and not self.complete:
            return "rebuilding: the store was found empty; waiting for every replica's part", False
        if local and not self.counted:
            return f"counting replicas: were the store to fail now, {UNCOUNTED}", False
        return None

    def _count_fail(self, mode: FailMode, reason: str) -> None:
        self.fail_admissions[mode] += 1
        if self.metrics is not None:
            self.metrics.fail_admissions.labels(mode.value, reason).inc()

    def _counted(self) -> bool:
        """Whether this replica knows how many divide: the count is declared, or read by
        its last heartbeat, which was no longer than the registry's TTL before the store
        stopped answering (a replica whose heartbeat was late longer than that may be
        missing from the others' counts, which then divide by fewer)."""
        if self.configured:
            return True
        since, beaten = self.failing_since, self.beaten
        late = since is not None and beaten is not None and since - beaten > self.registry_ttl
        return self.counted and not late

    async def _fail(self, who: Who, cost: Cost, now: float, reason: str) -> Decision:
        """The fail mode's decision; ``reason``: why the store did not decide
        (``unreachable``, or ``rebuilding``: its budgets not whole yet)."""
        mode = self.shared.policies.fail_mode(who.tenant, self.fail_mode)
        levels = self.shared.policies.levels(who.tenant, who.model, who.key)
        if mode is FailMode.LOCAL and not self._counted() and any(x.limits for x in levels):
            # no share can be computed: dividing by what it saw may give it the whole budget
            return self._undivided(who, "replicas_unknown", UNCOUNTED)
        if mode is FailMode.LOCAL and (budget := self._undividable(levels, now)) is not None:
            scope, limit = budget
            why = (
                f"this replica holds no remainder of {limit.name} of {':'.join(scope)} from "
                "the store to divide (a tenant it has not served, or the store found empty "
                "before it said what was left)"
            )
            return self._undivided(who, "no_remainder", why, f"{':'.join(scope)}:{limit.name}")
        self._count_fail(mode, reason)
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

    def _undividable(
        self, levels: tuple[Level, ...], now: float
    ) -> tuple[tuple[str, ...], Limit] | None:
        """The first budget of ``levels`` local fail mode has no remainder of to divide."""
        zone = self.shared.policies.zone
        for level in levels:
            for limit in level.limits:
                if limit.window is not None and limit.budget:
                    start, end = period(limit.window, now, zone)
                    key = self.shared.budget_key(level.scope, limit, start)
                    if self._remainder(key, limit, start, end) is None:
                        return level.scope, limit
        return None

    def _undivided(self, who: Who, reason: str, why: str, what: str = "") -> Decision:
        """Refused by local fail mode: a limit it cannot divide (logged once per reason
        and limit until the store answers again, counted every time)."""
        self._count_fail(FailMode.LOCAL, reason)
        if (seen := f"{reason}:{what}") not in self._warned:
            self._warned.add(seen)
            log.warning("limits_local_refused", reason=reason, tenant=who.tenant, why=why)
        return self._refused(who, f"local fail mode cannot divide its limits: {why}")

    def _refused(self, who: Who, why: str) -> Decision:
        wait = max(self.breaker.cooldown, 1.0)  # a 503 always says when to try again
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
        whole = self._whole_named(refusal.scope, refusal.limit, refusal.amount)
        if refusal.alone and refusal.cost <= whole:  # within the whole: once the store is back
            refusal = dataclasses.replace(refusal, wait=self.breaker.cooldown, budget=False)
        refusal = dataclasses.replace(refusal, amount=whole)
        return dataclasses.replace(decision, refusal=refusal)

    def _held(self, ticket: LocalTicket, decision: Decision | None, now: float) -> Decision:
        """Admitted without the store: held in this process, and in the store from this
        replica's next contribution on (at once while the store is being rebuilt)."""
        self.seq += 1
        ticket.seq = self.seq
        ticket.charged, self._taking = self._taking, []
        ticket.parts = [p for p in self.shared.parts(ticket.who, now) if p.kind != "r"]
        self.shared.holds[ticket.id] = ticket
        self.dirty = True  # the store learns of its holds by the next contribution
        if self.reachable and not self.breaker.open:  # rebuilding: at once
            self._contribute_soon()
        if decision is None:
            return Decision(ticket, None, None, None)
        return dataclasses.replace(decision, ticket=ticket)
