"""The in-process limiter: every level's meters in this process's memory, plus the usage
history the budgets are rebuilt from (the journal's records, ``proxy.limits.history``).

All methods run to completion without suspending, so on one event loop each reservation
is atomic: concurrent requests cannot all pass before any is charged.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any
from zoneinfo import ZoneInfo

from proxy.limits.history import BUCKET_SECONDS, History
from proxy.limits.limiter import (
    Cost,
    Decision,
    Lifetime,
    LimitStanding,
    Refusal,
    Standing,
    Ticket,
    Usage,
    Who,
    decision_of,
)
from proxy.limits.meters import BudgetMeter, Gate, Meter, RateMeter, UsedIn
from proxy.limits.periods import earliest_start
from proxy.limits.policy import Limit, Policies
from proxy.limits.standings import meter_standing, tenant_limits

MeterKey = tuple[tuple[str, ...], str]
# A limit's meter at a scope, given what its scope was billed in a period and the zone.
MakeMeter = Callable[[tuple[str, ...], Limit, UsedIn, ZoneInfo], Meter]


def plain_meter(scope: tuple[str, ...], limit: Limit, used_in: UsedIn, zone: ZoneInfo) -> Meter:
    """The meter of a limit in force here: a gate, a rate, or a calendar budget."""
    if limit.window is None:
        return Gate(limit)
    if not limit.window.budget:
        return RateMeter(limit)
    return BudgetMeter(limit, zone, used_in)


class InProcessLimiter:
    """``proxy.limits.limiter.Limiter`` in this process's memory; ``make`` makes each
    limit's meter (``divided``'s hold a replica's share)."""

    shared_store = False

    def __init__(self, policies: Policies, make: MakeMeter = plain_meter) -> None:
        self.policies = policies
        self._make = make
        self.history = History()
        # A pod's limiter host (``limitstore.host``) keeps each worker's part apart, so
        # that re-reading a dead worker's journal shard replaces its part (``part=k``).
        self.parts: dict[int, History] = {}
        self.meters: dict[MeterKey, Meter] = {}
        self._pruned = -math.inf

    def replace(self, policies: Policies) -> None:
        self.policies = policies

    def wants_tokens(self, tenant: str) -> bool:
        return self.policies.wants_tokens(tenant)

    def problem(self) -> tuple[str, bool] | None:
        return None

    def lifetime(self, *, journaled: bool) -> Lifetime:
        return still

    async def reserve(self, who: Who, cost: Cost, now: float) -> Decision:
        plan = [
            (level.scope, limit, self.meter(level.scope, limit), cost.of(limit.unit))
            for level in self.policies.levels(who.tenant, who.model, who.key)
            for limit in level.limits
        ]
        refusals = [
            Refusal(limit.name, scope, wait, units, limit.amount, limit.budget)
            for scope, limit, meter, units in plan
            if (wait := meter.wait(units, now)) > 0
        ]
        if refusals:
            worst = max(refusals, key=lambda r: r.wait)
            return _decision(None, worst, plan, now)
        ticket = Ticket(who, cost)
        for scope, limit, meter, units in plan:
            meter.take(units, now)
            ticket.taken.append((scope, limit.name, limit.unit))
        return _decision(ticket, None, plan, now)

    async def settle(
        self, ticket: Ticket, billed: Cost, now: float, *, part: int | None = None
    ) -> None:
        if not ticket.end():
            return
        # The meters first: one that re-reads its period now (a new period, or a part
        # read again) must not find these units in the history and add them again.
        for scope, name, unit in ticket.taken:
            meter = self.meters.get((scope, name))
            if meter is not None:
                meter.adjust(ticket.cost.of(unit), billed.of(unit), now)
        history = self.history if part is None else self.parts.setdefault(part, History())
        history.note(ticket.who, billed, now)
        self._prune(now)

    async def release(self, ticket: Ticket, now: float) -> None:
        if not ticket.end():
            return
        for scope, name, unit in ticket.taken:
            meter = self.meters.get((scope, name))
            if meter is not None:
                meter.give(ticket.cost.of(unit), now)

    async def restore(
        self, history: Iterable[Usage], now: float, *, part: int | None = None
    ) -> int:
        """Add ``history`` to the budgets' usage; with ``part``, replace that part's
        (a worker's journal shard, read again) by it."""
        target = self.history
        if part is not None:
            target = self.parts[part] = History()
        taken = 0
        for usage in history:
            target.note(usage.who, usage.cost, usage.at)
            taken += 1
        for meter in self.meters.values():  # re-read their period from the history
            meter.reread()
        return taken

    def adopt(self, part: int, history: History) -> None:
        """Replace ``part``'s usage (a worker's journal shard, read again) by
        ``history``, built elsewhere (off the event loop): the budgets re-read their
        period from it."""
        self.parts[part] = history
        for meter in self.meters.values():
            meter.reread()

    async def standing(self, tenant: str, now: float) -> list[LimitStanding]:
        return [
            meter_standing(scope, limit, self.meter(scope, limit), now)
            for scope, limit in tenant_limits(self.policies, tenant)
        ]

    def meter(self, scope: tuple[str, ...], limit: Limit) -> Meter:
        """The meter of ``limit`` at ``scope``, made on first use; a reload that changes
        its amount keeps a budget's usage and a gate's holders, and restarts a rate."""
        key = (scope, limit.name)
        meter = self.meters.get(key)
        if meter is not None and meter.amount == limit.amount:
            meter.rezone(self.policies.zone)
            return meter
        if meter is not None and meter.resize(limit.amount):
            return meter
        self.meters[key] = meter = self._new(scope, limit)
        return meter

    def _new(self, scope: tuple[str, ...], limit: Limit) -> Meter:
        unit = limit.unit

        def used_in(start: float, end: float) -> int:
            return sum(
                h.used(scope, unit, start, end) for h in (self.history, *self.parts.values())
            )

        return self._make(scope, limit, used_in, self.policies.zone)

    def _prune(self, now: float) -> None:
        """Forget history older than any period (at most once a quarter hour)."""
        if now - self._pruned < BUCKET_SECONDS:
            return
        self._pruned = now
        for history in (self.history, *self.parts.values()):
            history.prune(earliest_start(now, self.policies.zone))


async def still(app: Any) -> AsyncIterator[None]:
    """A limiter's lifetime with nothing to run while the application serves."""
    yield


Plan = list[tuple[tuple[str, ...], Limit, Meter, int]]


def _decision(ticket: Ticket | None, refusal: Refusal | None, plan: Plan, now: float) -> Decision:
    """The decision with the standings of every limit of ``plan`` (``decision_of``)."""
    standings = [
        (scope, limit, Standing(*meter.standing(now)))
        for scope, limit, meter, _ in plan
        if limit.window is not None
    ]
    return decision_of(ticket, refusal, standings)
