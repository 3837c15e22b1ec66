"""What the store last said was used of each budget, kept for local fail mode: from each
admission's answer and each heartbeat's read, ordered by the store's clock, and only when
the store knows every admission this replica made without it (contributed); a replica's
share is of what is left of the amount in force, less what it admitted without the store
since."""

from __future__ import annotations

import math
from collections.abc import Callable

from proxy.limits.limiter import Cost, Ticket
from proxy.limits.periods import period
from proxy.limits.policy import Level, Limit
from proxy.limitstore.redislimiter import RedisLimiter
from proxy.limitstore.tickets import Charge, Left, StoreTicket, Taken


class Remainders:
    """The remainders of the budgets this replica watches, by budget key, and the local
    admissions counted against them (``seq``)."""

    def __init__(self, shared: RedisLimiter, divided_by: Callable[[], int]) -> None:
        self._shared = shared
        self._divided_by = divided_by  # the replica count local fail mode divides by
        self._taking: list[Charge] = []  # the local admission being made
        # what was left of each budget in the store when it last said so, by its key
        self.left: dict[str, Left] = {}
        self.seq = 0  # local admissions so far (a remainder is after those up to its own)
        self.heard = float("-inf")  # the store's time when it last answered this replica

    def hear(self, at: float) -> None:
        """The store answered this replica at ``at`` (its clock)."""
        self.heard = max(self.heard, at)

    def remember(self, left: dict[str, tuple[int, float, Taken]], seq: int) -> None:
        """Keep what the store said was left of budgets, when it knows every admission
        this replica made without it (the contribution in the same call covers those up
        to ``seq``; one made while the call was out may not be in it), unless it said
        something later already."""
        if self.seq != seq:
            return
        for key, (remaining, at, part) in left.items():
            self.hear(at)
            self._keep(key, Left(part.limit.amount - remaining, at, seq, part.span))

    def read(self, now: float, seq: int, parts: list[Taken], consumed: list[int]) -> None:
        """What a heartbeat read of ``parts`` at ``now`` (the store's clock), unless this
        replica admitted without the store meanwhile (maybe not in the read); remainders
        of periods past are dropped."""
        if self.seq != seq:
            return
        for part, used in zip(parts, consumed, strict=True):
            self._keep(part.key, Left(used, now, seq, part.span))
        for key in [k for k, left in self.left.items() if left.end <= now]:
            del self.left[key]

    def _keep(self, key: str, left: Left) -> None:
        old = self.left.get(key)
        if old is None or old.at <= left.at:
            self.left[key] = left

    def _remainder(self, key: str, start: float, end: float) -> Left | None:
        """What the store last said was used of a budget's period; for a period that began
        after the store last answered this replica (it has, since this process started),
        nothing (nothing was spent in it through the store as far as this replica can
        know); else None."""
        left = self.left.get(key)
        if left is None and math.isfinite(self.heard) and start > self.heard:
            left = self.left[key] = Left(0, start, self.seq, end)
        return left

    def _period_left(self, scope: tuple[str, ...], limit: Limit, start: float) -> Left | None:
        assert limit.window is not None
        _, end = period(limit.window, start, self._shared.policies.zone)
        return self._remainder(self._shared.budget_key(scope, limit, start), start, end)

    def undividable(
        self, levels: tuple[Level, ...], now: float
    ) -> tuple[tuple[str, ...], Limit] | None:
        """The first budget of ``levels`` with no remainder to divide."""
        zone = self._shared.policies.zone
        for level in levels:
            for limit in level.limits:
                if limit.window is not None and limit.budget:
                    start, end = period(limit.window, now, zone)
                    key = self._shared.budget_key(level.scope, limit, start)
                    if self._remainder(key, start, end) is None:
                        return level.scope, limit
        return None

    def left_of(self, scope: tuple[str, ...], limit: Limit, start: float) -> tuple[int, int] | None:
        """For local fail mode: this replica's room in its share of what the store last
        said was left of a budget, and that remainder (None: it never said)."""
        left = self._period_left(scope, limit, start)
        if left is None:
            return None
        remainder = max(self.whole_of(scope, limit) - left.consumed, 0)
        return remainder // self._divided_by() - left.spent, remainder

    def whole_of(self, scope: tuple[str, ...], limit: Limit) -> int:
        """The amount in force of ``limit`` at ``scope`` (local mode's meters hold its
        share: a refusal and the headers quote the whole)."""
        return self.whole_named(scope, limit.name, limit.amount)

    def whole_named(self, scope: tuple[str, ...], name: str, default: int) -> int:
        levels = self._shared.policies.levels(scope[1], *_model_key(scope))
        for level in levels:
            if level.scope == scope:
                for whole in level.limits:
                    if whole.name == name:
                        return whole.amount
        return default

    def beyond_reserved(self, ticket: Ticket, billed: Cost) -> None:
        """A store reservation billed beyond what it reserved: the excess is not in the
        remainders the store told (they count the reservation), so it counts against
        them (the next remainder the store tells has it)."""
        if not isinstance(ticket, StoreTicket):
            return
        for part in ticket.parts:
            left = self.left.get(part.key) if part.kind == "b" else None
            excess = billed.of(part.limit.unit) - ticket.cost.of(part.limit.unit)
            if left is not None and excess > 0:
                left.spend(excess)

    def took_of(self, scope: tuple[str, ...], limit: Limit, start: float, units: int) -> None:
        """A local admission takes ``units`` from a budget: counted against what the store
        last said was left of it (the admission's ticket keeps the charge)."""
        left = self._period_left(scope, limit, start)
        if left is not None:
            left.spend(units)
            key = self._shared.budget_key(scope, limit, start)
            self._taking.append((key, left, limit.unit, units))

    def admitted(self) -> tuple[int, list[Charge]]:
        """A local admission made: its number, and what it took from the remainders."""
        self.seq += 1
        charged, self._taking = self._taking, []
        return self.seq, charged

    def ended(self, charged: list[Charge], billed: Cost | None) -> None:
        """A local admission ended: what it held of each remainder is given back, and what
        it billed (None: released) is spent from then on."""
        for key, left, unit, units in charged:
            spent = (billed.of(unit) if billed is not None else 0) - units
            current = self.left.get(key)
            if current is left:
                left.spend(spent)
            elif current is not None:  # read since, its hold in it: only a bill beyond it
                current.spend(max(spent, 0))


def _model_key(scope: tuple[str, ...]) -> tuple[str | None, str | None]:
    """The model and key a level's scope names (for ``Policies.levels``)."""
    kind = scope[0]
    return (scope[2] if kind == "model" else None, scope[2] if kind == "key" else None)
