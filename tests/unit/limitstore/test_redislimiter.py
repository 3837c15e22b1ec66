"""The shared limiter on a real redis-server (started per test, empty): all-or-nothing
reservations on the store's clock, idempotent settle and release, reservations that
expire or are cancelled, holds renewed while their requests live, and three replicas that
share one budget without overshoot."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import RedisError

from proxy.limits.limiter import Cost
from proxy.limitstore.memory import InProcessLimiter
from proxy.limitstore.tickets import Rebuilding
from tests.support.limitstores import ACME, MakeShared, joined, policies
from tests.support.redisserver import Store


async def test_all_or_nothing_and_headers(make_shared: MakeShared) -> None:
    """A request refused at the model level takes nothing at the tenant level; the
    standings are the in-process limiter's for the same sequence."""
    pols = policies(
        total_tokens_per_day=1000,
        requests_per_minute=10,
        models={"m": {"prompt_tokens_per_day": 100}},
    )
    shared, local = make_shared(pols), InProcessLimiter(pols)
    await joined(shared)
    now = time.time()
    for cost in (Cost(60, 5), Cost(50, 0), Cost(30, 0)):
        a, b = await shared.reserve(ACME, cost, now), await local.reserve(ACME, cost, now)
        assert (a.ticket is None) == (b.ticket is None)
        assert a.tokens is not None
        assert b.tokens is not None
        assert a.tokens.remaining == b.tokens.remaining
        assert a.budgets == b.budgets
        assert a.requests is not None
        assert b.requests is not None
        assert a.requests.remaining == b.requests.remaining
    refused = await shared.reserve(ACME, Cost(50, 0), now)
    assert refused.refusal is not None
    assert refused.refusal.scope == ("model", "acme", "m")
    assert refused.budgets == (("total_tokens_per_day", 1000 - 65 - 30),)
    alone = await shared.reserve(ACME, Cost(2000, 0), now)
    assert alone.refusal is not None
    assert alone.refusal.alone


async def test_settle_is_idempotent_and_release_gives_back(make_shared: MakeShared) -> None:
    """Settling replaces the reservation by the billed units, once: a retried settle (a
    fresh ticket object with the same id, as after a lost answer) charges nothing more;
    releasing returns the whole reservation."""
    lim = make_shared(policies(total_tokens_per_day=100, concurrency=1))
    await joined(lim)
    now = time.time()
    first = await lim.reserve(ACME, Cost(30, 20), now)
    assert first.ticket is not None
    assert first.tokens is not None
    assert first.tokens.remaining == 50
    gate = await lim.reserve(ACME, Cost(1, 0), now)
    assert gate.refusal is not None
    assert gate.refusal.limit == "concurrency"
    await lim.settle(first.ticket, Cost(10, 5), now)
    first.ticket.open = True  # as a retry that did not see the first answer
    await lim.settle(first.ticket, Cost(10, 5), now)
    second = await lim.reserve(ACME, Cost(20, 0), now)
    assert second.ticket is not None
    assert second.tokens is not None
    assert second.tokens.remaining == 100 - 15 - 20
    await lim.release(second.ticket, now)
    third = await lim.reserve(ACME, Cost(0, 0), now)
    assert third.tokens is not None
    assert third.tokens.remaining == 85


async def test_reservations_of_a_crashed_replica_expire(make_shared: MakeShared) -> None:
    """A reservation never settled (its replica died) is given back once its TTL passes."""
    lim = make_shared(policies(total_tokens_per_day=100, concurrency=1), reservation_ttl=0.2)
    await joined(lim)
    now = time.time()
    held = await lim.reserve(ACME, Cost(90, 0), now)
    assert held.ticket is not None
    assert (await lim.reserve(ACME, Cost(20, 0), now)).refusal is not None
    await asyncio.sleep(0.3)
    later = await lim.reserve(ACME, Cost(20, 0), time.time())
    assert later.ticket is not None


async def test_no_reservation_until_the_store_has_a_generation(make_shared: MakeShared) -> None:
    """A store with no generation (empty) makes no reservation: the replica is told to
    contribute first."""
    lim = make_shared(policies(total_tokens_per_day=1000))
    with pytest.raises(Rebuilding) as raised:
        await lim.reserve(ACME, Cost(1, 0), time.time())
    assert not raised.value.contributed
    assert await joined(lim) == [True]
    assert (await lim.reserve(ACME, Cost(1, 0), time.time())).ticket is not None


async def test_a_settlement_whose_answer_was_lost_counts_once(
    make_shared: MakeShared, redis_store: Store
) -> None:
    """A settlement whose sending failed is in this replica's total from then on, and is
    sent again ``late`` (its hold given back, nothing added): whether the store did it
    before its answer was lost, or never got it, or restarted empty meanwhile, the
    store's charge is what was billed, once."""
    lim = make_shared(policies(total_tokens_per_day=1000))
    await joined(lim)
    now = time.time()

    async def failed_sending(reached: bool) -> Any:
        decision = await lim.reserve(ACME, Cost(40, 0), now)
        assert decision.ticket is not None
        lim.book.note(decision.ticket, Cost(30, 0), now)
        lim.book.ended(decision.ticket)
        if reached:  # the store did it; the answer was lost
            await lim.finish(decision.ticket, Cost(30, 0), "settle")
        lim.book.sending.pop(decision.ticket.id, None)  # the sending over, failed
        return decision.ticket

    async def remaining() -> int:
        decision = await lim.reserve(ACME, Cost(0, 0), now)
        assert decision.tokens is not None
        return decision.tokens.remaining

    for reached, left in ((True, 970), (False, 940)):
        ticket = await failed_sending(reached)
        await joined(lim)  # the total, with it (its hold still held if never reached)
        assert await remaining() == left - (0 if reached else 40)
        await lim.finish(ticket, Cost(30, 0), "late")
        assert await remaining() == left
        await joined(lim)
        assert await remaining() == left
    ticket = await failed_sending(True)
    client = Redis.from_url(redis_store.url)
    await client.flushall()  # restarted empty
    await client.aclose()
    await joined(lim)  # rebuilt from the journal: all three settlements
    await lim.finish(ticket, Cost(30, 0), "late")
    assert await remaining() == 910


async def test_three_replicas_share_one_budget_without_overshoot(make_shared: MakeShared) -> None:
    """Three limiters (one connection each) reserve 300 concurrent requests against one
    budget: the admitted tokens never exceed it, and the store's charge is what the
    replicas settled."""
    pols = policies(total_tokens_per_day=10_000)
    replicas = [make_shared(pols, f"r{i}") for i in range(3)]
    await joined(*replicas)
    settled = [0, 0, 0]

    async def one(i: int) -> None:
        lim = replicas[i % 3]
        cost = Cost(40 + i % 17, 11)
        decision = await lim.reserve(ACME, cost, time.time())
        if decision.ticket is None:
            return
        await asyncio.sleep(0)
        billed = cost if i % 5 else Cost(cost.prompt, 0)  # some bill less than reserved
        settled[i % 3] += billed.prompt + billed.completion
        await lim.settle(decision.ticket, billed, time.time())

    await asyncio.gather(*(one(i) for i in range(300)))
    assert 0 < sum(settled) <= 10_000
    final = await replicas[0].reserve(ACME, Cost(0, 0), time.time())
    assert final.tokens is not None
    assert final.tokens.remaining == 10_000 - sum(settled)


async def test_a_cancelled_reservation_that_arrives_late_reserves_nothing(
    make_shared: MakeShared,
) -> None:
    """A reservation whose answer was lost is cancelled by its id: its holds are given
    back when it was made, and when the script reaches the store after the cancel it is
    refused whole (the gate of 1 stays free either way)."""
    lim = make_shared(policies(concurrency=1))
    await joined(lim)
    now = time.time()
    made = lim.ticket(ACME, Cost(0, 0), now)
    assert (await lim.reserve_ticket(made)).ticket is not None
    assert await lim.finish(made, Cost(0, 0, 0), "cancel")  # its answer was lost
    late = lim.ticket(ACME, Cost(0, 0), now)
    assert await lim.finish(late, Cost(0, 0, 0), "cancel")  # cancelled before it arrives
    with pytest.raises(RedisError):
        await lim.reserve_ticket(late)
    free = await lim.reserve(ACME, Cost(0, 0), now)
    assert free.ticket is not None


async def test_live_holds_are_renewed_in_one_round_trip_and_a_dead_replicas_expire(
    make_shared: MakeShared,
) -> None:
    """Holds live 0.3 s. Replica r1 renews its two requests in flight every 0.1 s, in one
    script call each time for all four holds (two gates, two budgets); r2 (crashed) holds
    one and renews nothing. After 0.5 s r2's hold is given back and r1's are not: one
    more request fits the gate of 3 and the budget counts r1's two, then the gate is full."""
    pols = policies(total_tokens_per_day=100, concurrency=3)
    r1, r2 = (
        make_shared(pols, "r1", reservation_ttl=0.3),
        make_shared(pols, "r2", reservation_ttl=0.3),
    )
    await joined(r1, r2)
    now = time.time()
    alive = [await r1.reserve(ACME, Cost(10, 0), now) for _ in range(2)]
    dead = await r2.reserve(ACME, Cost(10, 0), now)
    assert all(d.ticket is not None for d in [*alive, dead])
    calls = 0
    script = r1._renew

    async def counted(**kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return await script(**kwargs)

    r1._renew = counted
    for _ in range(5):
        await asyncio.sleep(0.1)
        assert await r1.renew() == (4, 4)
    assert calls == 5
    later = await r1.reserve(ACME, Cost(10, 0), time.time())
    assert later.ticket is not None  # r2's hold expired
    assert later.tokens is not None
    assert later.tokens.remaining == 100 - 3 * 10  # r1's two alive and this one
    full = await r1.reserve(ACME, Cost(0, 0), time.time())
    assert full.refusal is not None
    assert full.refusal.limit == "concurrency"
    first = alive[0].ticket
    assert first is not None
    await r1.settle(first, Cost(10, 0), time.time())
    assert await r1.renew() == (4, 4)  # the settled one is no longer renewed; `later` is
    assert calls == 6
