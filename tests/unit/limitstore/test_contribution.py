"""What this replica billed or admitted without the store reaches it once it answers, as
its total: once, whatever the retries; held reservations included in a rebuild."""

from __future__ import annotations

import time

from redis.asyncio import Redis

from proxy.limits.limiter import Cost
from proxy.limits.policy import FailMode
from tests.support.limitstores import ACME, MakeGuarded, billed_before, policies
from tests.support.redisserver import Store


async def test_usage_billed_without_the_store_is_contributed_once(
    make_guarded: MakeGuarded, redis_store: Store
) -> None:
    """Admitted by the local share while the store is down, then settled: the store
    started again empty is charged what the journal billed, the outage's record included,
    once however often the replica contributes."""
    pols = policies(prompt_tokens_per_day=300)
    limiter = make_guarded(pols, "r0", replicas=1)
    await billed_before(limiter, 40)
    assert await limiter.contribute() is True
    assert await limiter.beat(15) is not None  # what is left: local mode divides it
    redis_store.kill()
    decision = await limiter.reserve(ACME, Cost(25, 0), time.time())
    assert decision.ticket is not None
    assert limiter.calls.errors
    await limiter.settle(decision.ticket, Cost(25, 0), time.time())
    assert limiter.contribution.dirty
    redis_store.start()
    limiter.calls.breaker.open_until = 0.0
    assert await limiter.contribute() is True
    assert await limiter.contribute() is True
    after = await limiter.reserve(ACME, Cost(0, 0), time.time())
    assert after.tokens is not None
    assert after.tokens.remaining == 300 - 65


async def test_an_open_reservation_without_the_store_counts_in_the_rebuild(
    make_guarded: MakeGuarded, redis_store: Store
) -> None:
    """A request admitted without the store and still in flight when the store is rebuilt
    is held in the store by this replica's contribution (a reservation, given back by its
    end), so the others cannot spend it meanwhile."""
    pols = policies(prompt_tokens_per_day=300)
    limiter = make_guarded(pols, "r0", replicas=1)
    await limiter.restore([], time.time())
    assert await limiter.contribute() is True
    assert await limiter.beat(15) is not None  # what is left: local mode divides it
    redis_store.kill()
    decision = await limiter.reserve(ACME, Cost(50, 0), time.time())
    assert decision.ticket is not None
    redis_store.start()
    limiter.calls.breaker.open_until = 0.0
    assert await limiter.contribute() is True
    during = await limiter.reserve(ACME, Cost(0, 0), time.time())
    assert during.tokens is not None
    assert during.tokens.remaining == 250


async def test_usage_billed_while_the_store_was_skipped_is_contributed_when_back(
    make_guarded: MakeGuarded,
) -> None:
    """The store keeps its state but this replica could not reach it (the breaker open):
    what it admitted and billed meanwhile by its share is added to the store's charge when
    it answers again, once."""
    pols = policies(prompt_tokens_per_day=300)
    limiter = make_guarded(pols, "r0", replicas=1)
    await limiter.restore([], time.time())
    assert await limiter.contribute() is True
    assert await limiter.beat(15) is not None  # what is left: local mode divides it
    limiter.calls.breaker.count, limiter.calls.breaker.open_until = 3, time.monotonic() + 60
    decision = await limiter.reserve(ACME, Cost(30, 0), time.time())
    assert decision.ticket is not None
    assert limiter.mode.fail_admissions[FailMode.LOCAL] == 1
    await limiter.settle(decision.ticket, Cost(30, 0), time.time())
    limiter.calls.breaker.open_until = 0.0  # half open: the next call tries the store
    after = await limiter.reserve(ACME, Cost(0, 0), time.time())
    assert after.ticket is not None
    assert await limiter.contribute() is True
    assert await limiter.contribute() is True
    again = await limiter.reserve(ACME, Cost(0, 0), time.time())
    assert again.tokens is not None
    assert again.tokens.remaining == 270


async def test_a_settlement_skipped_by_the_open_breaker_is_contributed(
    make_guarded: MakeGuarded, redis_store: Store
) -> None:
    """A store reservation settled while the breaker is open: the settlement is not sent
    (kept to send again, late, to give its hold back) and is in this replica's total from
    then on, so the contribution when the store is back carries it, even when it reaches
    the store before the settlement sent again."""
    limiter = make_guarded(policies(prompt_tokens_per_day=300), "r0", replicas=1)
    await limiter.restore([], time.time())
    assert await limiter.contribute() is True
    decision = await limiter.reserve(ACME, Cost(40, 0), time.time())
    assert decision.ticket is not None
    limiter.calls.breaker.count, limiter.calls.breaker.open_until = 3, time.monotonic() + 60
    await limiter.settle(decision.ticket, Cost(30, 0), time.time())
    assert limiter.replay.missed
    breaker = limiter.calls.breaker
    breaker.count, breaker.open_until = 0, 0.0  # the store answers again
    assert await limiter.contribute() is True  # before the settlement sent again
    await limiter.replay.replay(None)
    assert not limiter.replay.missed
    (budget,) = limiter.shared.book.budgets(time.time())
    client = Redis.from_url(redis_store.url)
    try:  # read as the other replicas see it (this one's next reservation carries its total)
        charge = await client.hmget(budget.key, "used", "reserved")
    finally:
        await client.aclose()
    assert [int(v or 0) for v in charge] == [30, 0]
