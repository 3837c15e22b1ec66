"""A replica's share of the limits while the shared store cannot answer (``local`` fail
mode): the in-process limiter on the limits divided by the replica count, whose calendar
budgets divide what was *left* of each budget in the store when it last said so, rather
than the whole limit.

A budget admits ``floor(remainder / replicas)`` against what this replica admitted
without the store since the store said it, and never more than the limit's share against
this replica's own usage in the period (``meters.BudgetMeter``): a remainder is as old as
the store's last answer to this replica, and the others may have spent from it since,
while the limit's share is exact when the replicas' usage is even. A budget without a
remainder admits nothing (the guard refuses it first: whatever the others spent is not
known). Rates and concurrency keep dividing the limit: their windows refill, and a gate's
holders end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from zoneinfo import ZoneInfo

from proxy.limits.history import History
from proxy.limits.limiter import Cost, Decision, Ticket, Usage, Who
from proxy.limits.meters import (
    GATE_RETRY_SECONDS,
    HELD_RETRY_SECONDS,
    BudgetMeter,
    Gate,
    Meter,
    RateMeter,
    UsedIn,
)
from proxy.limits.policy import Limit, Policies
from proxy.limitstore.memory import InProcessLimiter

# What is left of a budget's period starting at ``start`` for this replica: (its room in
# its share of the store's last remainder, that remainder), or None without one.
LeftIn = Callable[[float], tuple[int, int] | None]
# The same for any budget: by its scope, its limit and its period's start.
LeftOf = Callable[[tuple[str, ...], Limit, float], tuple[int, int] | None]
# Units a reservation takes from a budget's period starting at ``start``.
TookIn = Callable[[float, int], None]
# The same for any budget, by its scope, its limit, its period's start and the units.
TookOf = Callable[[tuple[str, ...], Limit, float, int], None]
# The amount in force of a limit at a scope (a meter here holds the replica's share).
WholeOf = Callable[[tuple[str, ...], Limit], int]
# This replica's requests in flight through the store at a scope.
InFlight = Callable[[tuple[str, ...]], int]


class ShareMeter:
    """A budget in local fail mode: this replica's share of the remainder the store last
    told (``left_in``), and of the whole limit against its own usage (the budget meter it
    holds, whose counters are kept either way). What it takes is told to ``took_in``,
    which counts it against the remainder (before the standing is read)."""

    def __init__(
        self,
        limit: Limit,
        zone: ZoneInfo,
        used_in: UsedIn,
        left_in: LeftIn,
        took_in: TookIn,
        whole: Callable[[], int],
    ) -> None:
        self._budget = BudgetMeter(limit, zone, used_in)
        self._left_in = left_in
        self._took_in = took_in
        self._whole = whole

    @property
    def amount(self) -> int:
        return self._budget.amount

    def take(self, cost: int, now: float) -> None:
        self._budget.take(cost, now)
        self._took_in(self._budget.start, cost)

    def wait(self, cost: int, now: float) -> float:
        budget = self._budget
        whole = budget.wait(cost, now)  # the limit's share against own usage
        left = self._left_in(budget.start)
        if cost > budget.amount:
            return whole
        if left is None:  # nothing known to divide: maybe once the store answers
            return max(whole, min(HELD_RETRY_SECONDS, budget.end - now))
        room, remainder = left
        if cost <= room and whole == 0.0:
            return 0.0
        if cost <= remainder:  # within what the store had left: maybe once it answers
            return min(HELD_RETRY_SECONDS, budget.end - now)
        return budget.end - now

    def adjust(self, reserved: int, billed: int, now: float) -> None:
        self._budget.adjust(reserved, billed, now)

    def give(self, reserved: int, now: float) -> None:
        self._budget.give(reserved, now)

    def standing(self, now: float) -> tuple[int, int, float]:
        budget = self._budget
        _, remaining, reset = budget.standing(now)
        left = self._left_in(budget.start)
        if left is None:
            return self._whole(), remaining, reset
        return self._whole(), max(min(left[0], remaining), 0), budget.end - now

    def resize(self, amount: int) -> bool:
        return self._budget.resize(amount)

    def rezone(self, zone: ZoneInfo) -> None:
        self._budget.rezone(zone)

    def reread(self) -> None:
        self._budget.reread()


class ShareGate:
    """A concurrency limit in local fail mode: this replica's share, its requests in flight
    through the store counted in it (they hold the store's gate: an outage does not let
    as many more in). Its standing quotes the whole limit."""

    def __init__(self, limit: Limit, whole: Callable[[], int], in_flight: Callable[[], int]):
        self._gate = Gate(limit)
        self._whole = whole
        self._in_flight = in_flight

    @property
    def amount(self) -> int:
        return self._gate.amount

    def wait(self, cost: int, now: float) -> float:
        fits = self._gate.held + self._in_flight() + cost <= self._gate.amount
        return 0.0 if fits else GATE_RETRY_SECONDS

    def take(self, cost: int, now: float) -> None:
        self._gate.take(cost, now)

    def adjust(self, reserved: int, billed: int, now: float) -> None:
        self._gate.adjust(reserved, billed, now)

    def give(self, reserved: int, now: float) -> None:
        self._gate.give(reserved, now)

    def standing(self, now: float) -> tuple[int, int, float]:
        room = self._gate.amount - self._gate.held - self._in_flight()
        return self._whole(), max(room, 0), 0.0

    def resize(self, amount: int) -> bool:
        return self._gate.resize(amount)

    def rezone(self, zone: ZoneInfo) -> None:
        self._gate.rezone(zone)

    def reread(self) -> None:
        self._gate.reread()


class ShareRate:
    """A rate in local fail mode: this replica's share; its standing quotes the whole."""

    def __init__(self, limit: Limit, whole: Callable[[], int]) -> None:
        self._rate = RateMeter(limit)
        self._whole = whole

    @property
    def amount(self) -> int:
        return self._rate.amount

    def wait(self, cost: int, now: float) -> float:
        return self._rate.wait(cost, now)

    def take(self, cost: int, now: float) -> None:
        self._rate.take(cost, now)

    def adjust(self, reserved: int, billed: int, now: float) -> None:
        self._rate.adjust(reserved, billed, now)

    def give(self, reserved: int, now: float) -> None:
        self._rate.give(reserved, now)

    def standing(self, now: float) -> tuple[int, int, float]:
        _, remaining, reset = self._rate.standing(now)
        return self._whole(), remaining, reset

    def resize(self, amount: int) -> bool:
        return self._rate.resize(amount)

    def rezone(self, zone: ZoneInfo) -> None:
        self._rate.rezone(zone)

    def reread(self) -> None:
        self._rate.reread()


class ShareLimiter:
    """The in-process limiter on divided limits, with meters that hold this replica's
    share: ``ShareMeter``s for its budgets, ``ShareGate``s and ``ShareRate``s."""

    def __init__(
        self,
        policies: Policies,
        left_of: LeftOf,
        took_of: TookOf,
        whole_of: WholeOf,
        in_flight: InFlight,
    ) -> None:
        self._left_of = left_of
        self._took_of = took_of
        self._whole_of = whole_of
        self._in_flight = in_flight
        self._limiter = InProcessLimiter(policies, self._meter)

    @property
    def policies(self) -> Policies:
        return self._limiter.policies

    @property
    def history(self) -> History:
        """This replica's usage in its shares."""
        return self._limiter.history

    def replace(self, policies: Policies) -> None:
        self._limiter.replace(policies)

    async def reserve(self, who: Who, cost: Cost, now: float) -> Decision:
        return await self._limiter.reserve(who, cost, now)

    async def settle(self, ticket: Ticket, billed: Cost, now: float) -> None:
        await self._limiter.settle(ticket, billed, now)

    async def release(self, ticket: Ticket, now: float) -> None:
        await self._limiter.release(ticket, now)

    async def restore(self, history: Iterable[Usage], now: float) -> int:
        return await self._limiter.restore(history, now)

    def _meter(
        self, scope: tuple[str, ...], limit: Limit, used_in: UsedIn, zone: ZoneInfo
    ) -> Meter:
        def whole() -> int:
            return self._whole_of(scope, limit)

        if limit.window is None:
            return ShareGate(limit, whole, lambda: self._in_flight(scope))
        if not limit.window.budget:
            return ShareRate(limit, whole)
        return ShareMeter(
            limit,
            zone,
            used_in,
            lambda start: self._left_of(scope, limit, start),
            lambda start, units: self._took_of(scope, limit, start, units),
            whole,
        )

    def count_rates(self, who: Who, cost: Cost, now: float) -> None:
        """A request the store admitted, taken in this replica's shares of its rates as
        far as they have room (so an outage right after it does not admit the share
        again on top of it; never beyond full, which would refuse for longer than a
        window)."""
        for level in self.policies.levels(who.tenant, who.model, who.key):
            for limit in level.limits:
                if limit.window is not None and not limit.window.budget:
                    meter = self._limiter.meter(level.scope, limit)
                    units = cost.of(limit.unit)
                    if meter.wait(units, now) == 0.0:
                        meter.take(units, now)
