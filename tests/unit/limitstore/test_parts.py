"""This replica's part of each budget, contributed as its total: budgets rebuilt from each
journal after the store restarts empty (no reservation until every replica has
contributed, or the grace has passed), settlements that count once however often they
are sent."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from redis.exceptions import RedisError

from proxy.limits.limiter import Cost, Usage
from proxy.limitstore.tickets import LocalTicket, Rebuilding, StoreTicket
from tests.support.limitstores import ACME, MakeShared, joined, policies
from tests.support.redisserver import Store


async def test_budget_rebuilt_from_each_journal_after_an_empty_restart(
    make_shared: MakeShared, redis_store: Store
) -> None:
    """The store restarts empty: until every replica known before has added what its own
    journal billed this period, nobody reserves on it (the lazy rebuild let the first
    replica back admit against its own journal alone: #40); then the budget is whole
    and nobody is counted twice."""
    pols = policies(total_tokens_per_day=1000)
    one, two = make_shared(pols, "r1", grace=60.0), make_shared(pols, "r2", grace=60.0)
    await joined(one, two, known=2)
    now = time.time()
    for lim, cost in ((one, Cost(100, 0)), (two, Cost(200, 0))):
        decision = await lim.reserve(ACME, cost, now)
        assert decision.ticket is not None
        await lim.settle(decision.ticket, cost, now)
    redis_store.kill()
    redis_store.start()
    for lim in (one, two):  # a pooled connection the library did not find closed fails once
        with contextlib.suppress(RedisError):
            await lim.client.ping()
    assert await joined(one, known=2) == [False]
    with pytest.raises(Rebuilding) as raised:
        await one.reserve(ACME, Cost(700, 0), now)  # 900 would be admitted with r1's part alone
    assert raised.value.contributed
    assert await joined(two, known=2) == [True]
    after = await two.reserve(ACME, Cost(0, 0), now)
    assert after.tokens is not None
    assert after.tokens.remaining == 700
    assert await joined(one, two, known=2) == [True, True]  # a second contribution adds nothing
    again = await one.reserve(ACME, Cost(0, 0), now)
    assert again.tokens is not None
    assert again.tokens.remaining == 700


async def test_a_generation_waits_its_grace_for_unknown_replicas(make_shared: MakeShared) -> None:
    """Without a replica count known before, a new generation is whole only after its
    grace, and only if every replica alive in the registry has contributed."""
    pols = policies(total_tokens_per_day=1000)
    one, two = make_shared(pols, "r1", grace=0.3), make_shared(pols, "r2", grace=0.3)
    await one.client.zadd(one.keys.registry, {"r1": time.time(), "r2": time.time()})
    assert await joined(one) == [False]
    await asyncio.sleep(0.35)
    assert await joined(one) == [False]  # r2 is alive and has not contributed
    assert await joined(two) == [True]


async def test_a_generation_waits_for_as_many_as_were_counted_not_its_grace(
    make_shared: MakeShared,
) -> None:
    """A replica count read before (not declared) spares a new generation its grace once
    that many replicas have contributed, but every replica alive in the registry is still
    waited for (a count read before a replica joined is not trusted over the registry)."""
    pols = policies(total_tokens_per_day=1000)
    one, two, three = (make_shared(pols, f"r{i}", grace=60.0) for i in (1, 2, 3))
    now = time.time()
    assert [(await r.sync(0, now, seen=2)).complete for r in (one, two)] == [False, True]
    await one.client.flushall()  # restarted empty again, three replicas alive now
    await one.client.zadd(one.keys.registry, {"r1": now, "r2": now, "r3": now})
    assert [(await r.sync(0, now, seen=2)).complete for r in (one, two)] == [False, False]
    assert (await three.sync(0, now, seen=2)).complete


async def test_settlements_write_totals_so_retries_count_once(make_shared: MakeShared) -> None:
    """A settlement adds itself once per id and a contribution raises to the journal's
    total: a settlement, a contribution and a retried settlement after it each leave the
    store's charge at what was billed."""
    lim = make_shared(policies(total_tokens_per_day=1000))
    await joined(lim)
    now = time.time()
    decision = await lim.reserve(ACME, Cost(40, 0), now)
    assert decision.ticket is not None
    await lim.settle(decision.ticket, Cost(30, 0), now)
    await joined(lim)
    decision.ticket.open = True
    await lim.settle(decision.ticket, Cost(30, 0), now)
    after = await lim.reserve(ACME, Cost(0, 0), now)
    assert after.tokens is not None
    assert after.tokens.remaining == 970


async def test_restore_feeds_the_rebuild(make_shared: MakeShared) -> None:
    """A replica restarted from its journal adds the journal's usage to an empty store."""
    lim = make_shared(policies(total_tokens_per_day=1000))
    now = time.time()
    assert await lim.restore([Usage(ACME, now - 1, Cost(250, 50, 3))], now) == 1
    await joined(lim)
    decision = await lim.reserve(ACME, Cost(0, 0), now)
    assert decision.tokens is not None
    assert decision.tokens.remaining == 700


async def test_an_incomplete_generation_reserves_nothing_and_the_whole_sees_every_part(
    make_shared: MakeShared,
) -> None:
    """While a store found empty waits for replicas, nothing is reserved on it (each
    replica admits by its fail mode meanwhile, in process); once every replica expected
    has contributed, their parts (billed, and held in requests admitted without the
    store: taken there as reservations) are all in it."""
    pols = policies(prompt_tokens_per_day=300)
    one, two, three = (make_shared(pols, f"r{i}", grace=60.0) for i in range(3))
    now = time.time()
    for lim in (one, two, three):
        await lim.restore([Usage(ACME, now - 1, Cost(90, 0))], now)
    assert await joined(one, known=3) == [False]
    with pytest.raises(Rebuilding) as raised:
        await one.reserve(ACME, Cost(1, 0), now)
    assert raised.value.contributed
    local = LocalTicket(ACME, Cost(10, 0), id="local")  # admitted in process meanwhile
    local.parts = [p for p in three.parts(ACME, now) if p.kind != "r"]
    three.book.holds[local.id] = local
    assert await joined(two, three, known=3) == [False, True]
    over = await two.reserve(ACME, Cost(1, 0), now)  # 270 billed + 10 held by r2
    assert over.tokens is not None
    assert over.tokens.remaining == 19


async def test_a_settlement_carried_by_a_contribution_adds_nothing_when_it_lands(
    make_shared: MakeShared,
) -> None:
    """A settlement whose sending failed joins the replica's total; the contribution that
    carries it claims its id, so its first sending, landing afterwards, adds nothing
    (before: 30 billed were charged 60 until the day ended) and gives its hold back."""
    lim = make_shared(policies(prompt_tokens_per_day=300))
    await joined(lim)
    now = time.time()
    decision = await lim.reserve(ACME, Cost(40, 0), now)
    ticket = decision.ticket
    assert isinstance(ticket, StoreTicket)
    lim.book.note(ticket, Cost(30, 0), now)
    lim.book.sending.pop(ticket.id)  # its sending failed: in this replica's total from now on
    lim.book.unclaimed[ticket.id] = ticket
    await joined(lim)
    assert not lim.book.unclaimed
    assert not await lim.finish(ticket, Cost(30, 0), "settle")  # the first sending lands
    after = await lim.reserve(ACME, Cost(0, 0), now)
    assert after.tokens is not None
    assert after.tokens.remaining == 270
