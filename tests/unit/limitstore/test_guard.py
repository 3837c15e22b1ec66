"""The guarded limiter as admission uses it, on a real redis-server: a settlement on its
way to the store counts once, and one tenant's burst waits for a slot outside the
timeout, so it neither opens a rate limit by the fail mode nor refuses the others."""

from __future__ import annotations

import asyncio
import time

from proxy.limits.limiter import Cost
from tests.support.limitstores import ACME, MakeGuarded, burst, policies
from tests.support.redisserver import Store


async def test_a_settlement_on_its_way_to_the_store_is_not_counted_twice(
    make_guarded: MakeGuarded,
) -> None:
    """6 tokens a day, one store slot: A (3) is admitted; B (3) waits for the slot, then
    A's settlement queues behind it. B must be admitted (3 settled + 3 reserved = 6): A's
    3 tokens were counted twice, once in this replica's part (its history, read by B's
    reservation) and once in the store's ``reserved`` (A's settlement not yet there), and
    B was refused with the budget not spent (seen under load: 147 of 150 admitted)."""
    limiter = make_guarded(policies(prompt_tokens_per_day=6), "r0", replicas=1, slots=1)
    await limiter.restore([], time.time())
    assert await limiter.contribute() is True
    first = await limiter.reserve(ACME, Cost(3, 0), time.time())
    assert first.ticket is not None
    await limiter.calls.slots.acquire()  # the one slot busy: B queues first, A's settlement next
    second = asyncio.create_task(limiter.reserve(ACME, Cost(3, 0), time.time()))
    await asyncio.sleep(0)
    settled = asyncio.create_task(limiter.settle(first.ticket, Cost(3, 0), time.time()))
    await asyncio.sleep(0)
    limiter.calls.slots.release()
    decision = await second
    await settled
    assert decision.ticket is not None, decision.refusal
    assert decision.tokens is not None
    assert decision.tokens.remaining == 0
    await limiter.settle(decision.ticket, Cost(3, 0), time.time())
    after = await limiter.reserve(ACME, Cost(0, 0), time.time())
    assert after.tokens is not None
    assert after.tokens.remaining == 0  # 6 billed in all, nothing counted twice or lost


async def test_a_burst_does_not_open_a_rate_limit(redis_store: Store) -> None:
    """Fail mode open, the store up and answering: a tenant's burst of 1000 against 10
    requests a minute is admitted about 10 times, not by the fail mode."""
    _, evil, _ = await burst(redis_store, "open")
    assert sum(d.ticket is not None for d in evil) <= 20


async def test_a_burst_does_not_refuse_other_tenants(redis_store: Store) -> None:
    """Fail mode closed, the store up: another tenant's requests during the burst are
    admitted by the store, not refused as if it were down."""
    _, _, good = await burst(redis_store, "closed")
    assert [d.ticket is not None for d in good] == [True] * 5
