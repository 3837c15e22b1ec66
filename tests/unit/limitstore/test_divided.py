"""A replica's share in local fail mode: a budget with a remainder the store told admits
its room in it, counting what it takes there, and refuses beyond it to retry soon or at
the period's end; a budget without one admits nothing; every rate keeps the limit's
share."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

from proxy.limits.limiter import Cost, Who
from proxy.limits.policy import Limit, Policies
from proxy.limitstore.divided import ShareLimiter

NOW = datetime(2026, 12, 3, 9, 30, tzinfo=ZoneInfo("UTC")).timestamp()
ACME = Who("acme")
Scope = tuple[str, ...]


class Remainders:
    """What the guard would tell: a remainder per limit name, divided by ``replicas``,
    less what was taken there since."""

    def __init__(self, replicas: int, **left: int) -> None:
        self.replicas = replicas
        self.left = left
        self.taken: dict[str, int] = {}

    def left_of(self, scope: Scope, limit: Limit, start: float) -> tuple[int, int] | None:
        remainder = self.left.get(limit.name)
        if remainder is None:
            return None
        return remainder // self.replicas - self.taken.get(limit.name, 0), remainder

    def took_of(self, scope: Scope, limit: Limit, start: float, units: int) -> None:
        self.taken[limit.name] = self.taken.get(limit.name, 0) + units


def share(remainders: Remainders, **tenant: object) -> ShareLimiter:
    """The share limiter of ``tenant``'s limits over ``remainders.replicas``, no request in
    flight through the store."""
    whole = Policies.model_validate({"tenants": {"acme": tenant}})

    def whole_of(scope: Scope, limit: Limit) -> int:
        (level,) = [v for v in whole.levels(scope[1], None, None) if v.scope == scope]
        return next(x.amount for x in level.limits if x.name == limit.name)

    pols = whole.divided(remainders.replicas)
    return ShareLimiter(pols, remainders.left_of, remainders.took_of, whole_of, lambda _: 0)


async def test_a_budget_with_a_remainder_admits_its_room_in_it() -> None:
    """300 a day over 3 replicas, 30 left in the store: this replica's room is 10; what it
    takes counts (and shows in the standing); beyond its room but within the 30 it is
    refused for a second, beyond the 30 until the day ends."""
    remainders = Remainders(3, prompt_tokens_per_day=30)
    limiter = share(remainders, prompt_tokens_per_day=300)
    first = await limiter.reserve(ACME, Cost(6, 0), NOW)
    assert first.ticket is not None
    assert first.tokens is not None
    assert first.tokens.remaining == 4
    assert remainders.taken == {"prompt_tokens_per_day": 6}
    soon = await limiter.reserve(ACME, Cost(5, 0), NOW)
    assert soon.refusal is not None
    assert soon.refusal.wait == 1.0
    later = await limiter.reserve(ACME, Cost(31, 0), NOW)
    assert later.refusal is not None
    assert later.refusal.distant
    assert not later.refusal.alone
    assert remainders.taken == {"prompt_tokens_per_day": 6}  # refusals take nothing


async def test_without_a_remainder_a_budget_admits_nothing_and_a_rate_divides() -> None:
    """No remainder known: whatever the others spent is unknown, so the budget admits
    nothing, to retry soon (the guard refuses such a budget before asking); a rate
    divides its limit either way (10 a minute: 3 here)."""
    remainders = Remainders(3)
    limiter = share(remainders, prompt_tokens_per_day=300, requests_per_minute=10)
    none = await limiter.reserve(ACME, Cost(1, 0), NOW)
    assert none.refusal is not None
    assert none.refusal.limit == "prompt_tokens_per_day"
    assert none.refusal.wait == 1.0
    rated = share(remainders, requests_per_minute=10)
    admitted = [await rated.reserve(ACME, Cost(), NOW) for _ in range(4)]
    assert [d.ticket is not None for d in admitted] == [True, True, True, False]
    assert admitted[0].requests is not None  # the whole limit quoted, the share's room
    assert (admitted[0].requests.limit, admitted[0].requests.remaining) == (10, 2)
