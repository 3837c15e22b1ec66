"""A tenant's standing read from the store (``store_standings``): the in-process limiter's for
the same sequence, holds past their expiry given back, nothing written, and nothing
answered while the store's budgets are not whole."""

from __future__ import annotations

import asyncio
import time

import pytest

from proxy.limits.limiter import Cost, LimitStanding, StandingUnknown
from proxy.limitstore.memory import InProcessLimiter
from proxy.limitstore.store_standings import tenant_parts
from tests.support.limitstores import ACME, MakeGuarded, MakeShared, joined, policies
from tests.support.redisserver import Store

POLICIES = {
    "total_tokens_per_day": 1000,
    "requests_per_minute": 10,
    "concurrency": 4,
    "models": {"m": {"prompt_tokens_per_day": 100}},
    "keys": {"k1": {"requests_per_hour": 50}},
}


def figures(readings: list[LimitStanding]) -> list[tuple[object, ...]]:
    return [
        (r.scope, r.limit.name, r.used, r.held, r.standing.limit, r.standing.remaining)
        for r in readings
    ]


async def test_the_stores_standing_is_the_in_process_limiters(make_shared: MakeShared) -> None:
    """After the same reservations, settlements and one hold still in flight, the store's
    reading of every level's limits is the in-process limiter's."""
    pols = policies(**POLICIES)
    shared, local = make_shared(pols), InProcessLimiter(pols)
    await joined(shared)
    now = time.time()
    for limiter in (shared, local):
        first = await limiter.reserve(ACME, Cost(60, 5), now)
        assert first.ticket is not None
        await limiter.settle(first.ticket, Cost(40, 5), now)
        held = await limiter.reserve(ACME, Cost(30, 0), now)
        assert held.ticket is not None
    a, b = await shared.standing("acme", now), await local.standing("acme", now)
    assert figures(a) == figures(b)
    told = {r.limit.name: r for r in a}
    assert told["total_tokens_per_day"].used == 45
    assert told["total_tokens_per_day"].held == 30
    assert told["concurrency"].used == 1  # the hold in flight


async def test_a_reading_writes_nothing(make_shared: MakeShared) -> None:
    """The store's keys and values are the same before and after a reading."""
    lim = make_shared(policies(**POLICIES))
    await joined(lim)
    ticket = (await lim.reserve(ACME, Cost(10, 0), time.time())).ticket
    assert ticket is not None

    async def dump() -> dict[bytes, object]:
        keys = await lim.client.keys("*")
        return {k: await lim.client.dump(k) for k in sorted(keys)}

    before = await dump()
    await lim.standing("acme", time.time())
    assert await dump() == before


async def test_holds_past_their_expiry_are_not_counted(make_shared: MakeShared) -> None:
    """A hold whose replica died stops counting once its TTL passes, as the next
    reservation would find it."""
    lim = make_shared(policies(total_tokens_per_day=100, concurrency=1), reservation_ttl=0.2)
    await joined(lim)
    assert (await lim.reserve(ACME, Cost(90, 0), time.time())).ticket is not None
    held = {r.limit.name: r.held for r in await lim.standing("acme", time.time())}
    assert held == {"total_tokens_per_day": 90, "concurrency": 0}
    gate = {r.limit.name: r.used for r in await lim.standing("acme", time.time())}
    assert gate["concurrency"] == 1
    await asyncio.sleep(0.3)
    after = {r.limit.name: r for r in await lim.standing("acme", time.time())}
    assert after["total_tokens_per_day"].standing.remaining == 100
    assert after["concurrency"].used == 0


async def test_nothing_is_told_while_the_budgets_are_not_whole(make_shared: MakeShared) -> None:
    """A store without a complete generation (found empty, being rebuilt) is not read."""
    lim = make_shared(policies(total_tokens_per_day=100))
    with pytest.raises(StandingUnknown):
        await lim.standing("acme", time.time())


def test_a_tenants_parts_are_every_level_once(make_shared: MakeShared) -> None:
    """The tenant's own limits, its model's and its key's, each key once."""
    lim = make_shared(policies(**POLICIES))
    parts = tenant_parts(lim.policies, lim.parts, "acme", time.time())
    assert sorted((p.scope, p.limit.name) for p in parts) == sorted(
        [
            (("tenant", "acme"), "total_tokens_per_day"),
            (("tenant", "acme"), "requests_per_minute"),
            (("tenant", "acme"), "concurrency"),
            (("model", "acme", "m"), "prompt_tokens_per_day"),
            (("key", "acme", "k1"), "requests_per_hour"),
        ]
    )
    assert len({p.key for p in parts}) == len(parts)


async def test_the_guard_reads_the_store_or_says_it_cannot(
    make_guarded: MakeGuarded, redis_store: Store
) -> None:
    """The guarded limiter's standing is the store's; with the store gone, or its
    breaker open, it says it cannot (no replica's partial view stands in) and leaves
    the breaker as admission left it."""
    guarded = make_guarded(policies(total_tokens_per_day=100), "r1", replicas=1, timeout=0.5)
    await guarded.restore([], time.time())
    await guarded.contribute()
    assert (await guarded.reserve(ACME, Cost(10, 0), time.time())).ticket is not None
    read = await guarded.standing("acme", time.time())
    assert figures(read) == figures(await guarded.shared.standing("acme", time.time()))
    redis_store.kill()
    with pytest.raises(StandingUnknown):
        await guarded.standing("acme", time.time())
    assert guarded.calls.breaker.count == 0  # a failed read is no admission's failure
    guarded.calls.breaker.count = guarded.calls.breaker.failures
    with pytest.raises(StandingUnknown, match="unreachable"):
        await guarded.standing("acme", time.time())
