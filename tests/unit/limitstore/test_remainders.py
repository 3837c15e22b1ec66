"""What the store last said was left of each budget, kept for local fail mode: the
replicas together stay within the budget, a replica gets the smaller of its two shares,
and no older reading replaces a later one."""

from __future__ import annotations

import time
from typing import Any

from proxy.limits.limiter import Cost
from tests.support.limitstores import ACME, MakeGuarded, policies, three_after_290
from tests.support.redisserver import Store


async def test_local_mode_keeps_the_total_within_the_budget(
    make_guarded: MakeGuarded, redis_store: Store
) -> None:
    """Three replicas share 300 tokens a day; one billed 290 of them through the store,
    and each heartbeat ran after it (every 5 s in service). The store goes away: together
    the replicas may admit at most the 10 that are left."""
    pols = policies(prompt_tokens_per_day=300)
    replicas = await three_after_290(make_guarded, pols)
    redis_store.kill()
    admitted = 0
    for replica in replicas:
        for _ in range(10):
            decision = await replica.reserve(ACME, Cost(10, 0), time.time())
            admitted += 10 if decision.ticket is not None else 0
    assert 290 + admitted <= 300


async def test_local_mode_divides_what_was_left_not_the_replicas_own_usage(
    make_guarded: MakeGuarded, redis_store: Store
) -> None:
    """1,000 tokens a day, three replicas; r0 billed 290 through the store and the
    heartbeats read 710 left. In the outage r1 (which billed nothing) may admit a third of
    those 710 (236), not the limit's third (333), and a request beyond its room but
    within the 710 is refused to retry soon, not for the day; r0 is held to the smaller
    of its two shares: the limit's third less its own 290 (43)."""
    pols = policies(prompt_tokens_per_day=1000)
    replicas = await three_after_290(make_guarded, pols)
    redis_store.kill()
    r0, r1 = replicas[0], replicas[1]
    first = await r1.reserve(ACME, Cost(200, 0), time.time())
    assert first.ticket is not None
    assert first.tokens is not None
    assert first.tokens.remaining == 36
    await r1.settle(first.ticket, Cost(150, 0), time.time())  # billed less than held
    second = await r1.reserve(ACME, Cost(86, 0), time.time())
    assert second.ticket is not None
    beyond = await r1.reserve(ACME, Cost(1, 0), time.time())
    assert beyond.refusal is not None
    assert 0 < beyond.refusal.wait <= 1.0
    assert not beyond.refusal.distant
    assert (await r0.reserve(ACME, Cost(44, 0), time.time())).ticket is None
    assert (await r0.reserve(ACME, Cost(43, 0), time.time())).ticket is not None


async def test_a_heartbeat_does_not_forget_admissions_the_store_has_not_seen(
    make_guarded: MakeGuarded, redis_store: Store
) -> None:
    """One replica, 300 a day. With the breaker open it admits 100 locally (held, not yet
    in the store); a heartbeat meanwhile reads 300 left in the store, which does not
    count them, so it keeps its older remainder: in the outage that follows it admits
    at most 200 more, not 300."""
    limiter = make_guarded(policies(prompt_tokens_per_day=300), "r0", replicas=1)
    await limiter.restore([], time.time())
    assert await limiter.contribute() is True
    assert await limiter.beat(15) is not None  # reads 300 left
    limiter.calls.breaker.count, limiter.calls.breaker.open_until = 3, time.monotonic() + 60
    held = await limiter.reserve(ACME, Cost(100, 0), time.time())
    assert held.ticket is not None
    assert await limiter.beat(15) is not None  # the heartbeat reaches the store
    redis_store.kill()
    more = await limiter.reserve(ACME, Cost(150, 0), time.time())
    assert more.ticket is not None
    over = await limiter.reserve(ACME, Cost(60, 0), time.time())
    assert over.refusal is not None


async def test_a_remainder_read_earlier_does_not_replace_a_later_one(
    make_guarded: MakeGuarded, redis_store: Store
) -> None:
    """Answers on separate connections can be read out of order: a remainder the store
    told earlier (a heartbeat's read before a burst, its answer read after it) does not
    replace the later one, so the outage share is of what was left last (seen under
    load: three replicas admitted 327 of 300)."""
    pols = policies(prompt_tokens_per_day=300)
    limiter = make_guarded(pols, "r0", replicas=1)
    await limiter.restore([], time.time())
    assert await limiter.contribute() is True
    early: dict[str, tuple[int, float, Any]] = {}
    ticket = limiter.shared.ticket(ACME, Cost(0, 0), time.time())
    first = await limiter.shared.reserve_ticket(ticket, early)
    assert first.ticket is not None
    spent = await limiter.reserve(ACME, Cost(200, 0), time.time())
    assert spent.ticket is not None
    remainders = limiter.mode.remainders
    remainders.remember(early, remainders.seq)  # the earlier answer (300 left) read last
    redis_store.kill()
    more = await limiter.reserve(ACME, Cost(150, 0), time.time())
    assert more.refusal is not None  # 100 were left, not 300
    fits = await limiter.reserve(ACME, Cost(100, 0), time.time())
    assert fits.ticket is not None
