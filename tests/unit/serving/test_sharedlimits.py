"""The shared limiter on a real redis-server (started per test, empty): all-or-nothing
reservations on the store's clock, idempotent settle and release, reservations that
expire, budgets rebuilt from each replica's journal when the store restarts empty (no
reservation until every replica has contributed), and three replicas that share one
budget without overshoot."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import RedisError

from proxy.limits.limiter import Cost, Ticket, Usage, Who
from proxy.limits.policy import Policies
from proxy.limitstore.client import connect
from proxy.limitstore.memory import InProcessLimiter
from proxy.limitstore.redislimiter import RedisLimiter
from proxy.limitstore.tickets import Rebuilding, StoreTicket
from tests.support.redisserver import Store

ACME = Who("acme", "m", "k1")
# The product's client (no retries), with room for a loaded box's round trips.
STORE_TIMEOUT = 5.0

Make = Callable[..., RedisLimiter]


def policies(**tenant: object) -> Policies:
    return Policies.model_validate({"tenants": {"acme": tenant}})


@pytest.fixture
async def make(redis_store: Store) -> AsyncIterator[Make]:
    clients: list[Redis] = []

    def build(pols: Policies, replica: str = "r1", **options: Any) -> RedisLimiter:
        client = connect(redis_store.url, timeout=STORE_TIMEOUT)
        clients.append(client)
        return RedisLimiter(pols, client, replica=replica, **{"grace": 0.0, **options})

    yield build
    for client in clients:
        await client.aclose()


async def joined(*limiters: RedisLimiter, known: int = 0) -> list[bool]:
    """Each replica contributes its journal to the store, in turn: whether the store's
    budgets were whole after each."""
    return [(await lim.sync(known, time.time())).complete for lim in limiters]


async def test_all_or_nothing_and_headers(make: Make) -> None:
    """A request refused at the model level takes nothing at the tenant level; the
    standings are the in-process limiter's for the same sequence."""
    pols = policies(
        total_tokens_per_day=1000,
        requests_per_minute=10,
        models={"m": {"prompt_tokens_per_day": 100}},
    )
    shared, local = make(pols), InProcessLimiter(pols)
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


async def test_settle_is_idempotent_and_release_gives_back(make: Make) -> None:
    """Settling replaces the reservation by the billed units, once: a retried settle (a
    fresh ticket object with the same id, as after a lost answer) charges nothing more;
    releasing returns the whole reservation."""
    lim = make(policies(total_tokens_per_day=100, concurrency=1))
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


async def test_reservations_of_a_crashed_replica_expire(make: Make) -> None:
    """A reservation never settled (its replica died) is given back once its TTL passes."""
    lim = make(policies(total_tokens_per_day=100, concurrency=1), reservation_ttl=0.2)
    await joined(lim)
    now = time.time()
    held = await lim.reserve(ACME, Cost(90, 0), now)
    assert held.ticket is not None
    assert (await lim.reserve(ACME, Cost(20, 0), now)).refusal is not None
    await asyncio.sleep(0.3)
    later = await lim.reserve(ACME, Cost(20, 0), time.time())
    assert later.ticket is not None


async def test_keys_expire(make: Make, redis_store: Store) -> None:
    """Every key the limiter writes has an expiry (none lives forever)."""
    lim = make(policies(total_tokens_per_day=100, total_tokens_per_minute=50, concurrency=2))
    await joined(lim)
    decision = await lim.reserve(ACME, Cost(5, 5), time.time())
    assert decision.ticket is not None
    await lim.settle(decision.ticket, Cost(5, 5), time.time())
    client = Redis.from_url(redis_store.url)
    keys = await client.keys("*")
    assert keys
    assert all([await client.ttl(k) > 0 for k in keys])
    await client.aclose()


async def test_no_reservation_until_the_store_has_a_generation(make: Make) -> None:
    """A store with no generation (empty) makes no reservation: the replica is told to
    contribute first."""
    lim = make(policies(total_tokens_per_day=1000))
    with pytest.raises(Rebuilding) as raised:
        await lim.reserve(ACME, Cost(1, 0), time.time())
    assert not raised.value.contributed
    assert await joined(lim) == [True]
    assert (await lim.reserve(ACME, Cost(1, 0), time.time())).ticket is not None


async def test_budget_rebuilt_from_each_journal_after_an_empty_restart(
    make: Make, redis_store: Store
) -> None:
    """The store restarts empty: until every replica known before has added what its own
    journal billed this period, nobody reserves on it (the lazy rebuild let the first
    replica back admit against its own journal alone: #40); then the budget is whole
    and nobody is counted twice."""
    pols = policies(total_tokens_per_day=1000)
    one, two = make(pols, "r1", grace=60.0), make(pols, "r2", grace=60.0)
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


async def test_a_generation_waits_its_grace_for_unknown_replicas(make: Make) -> None:
    """Without a replica count known before, a new generation is whole only after its
    grace, and only if every replica alive in the registry has contributed."""
    pols = policies(total_tokens_per_day=1000)
    one, two = make(pols, "r1", grace=0.3), make(pols, "r2", grace=0.3)
    await one.client.zadd(one.registry_key, {"r1": time.time(), "r2": time.time()})
    assert await joined(one) == [False]
    await asyncio.sleep(0.35)
    assert await joined(one) == [False]  # r2 is alive and has not contributed
    assert await joined(two) == [True]


async def test_settlements_write_totals_so_retries_count_once(make: Make) -> None:
    """A settlement adds itself once per id and a contribution raises to the journal's
    total: a settlement, a contribution and a retried settlement after it each leave the
    store's charge at what was billed."""
    lim = make(policies(total_tokens_per_day=1000))
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


async def test_a_settlement_whose_answer_was_lost_counts_once(
    make: Make, redis_store: Store
) -> None:
    """A settlement whose sending failed is in this replica's total from then on, and is
    sent again ``late`` (its hold given back, nothing added): whether the store did it
    before its answer was lost, or never got it, or restarted empty meanwhile, the
    store's charge is what was billed, once."""
    lim = make(policies(total_tokens_per_day=1000))
    await joined(lim)
    now = time.time()

    async def failed_sending(reached: bool) -> Any:
        decision = await lim.reserve(ACME, Cost(40, 0), now)
        assert decision.ticket is not None
        lim.note(decision.ticket, Cost(30, 0), now)
        lim.ended(decision.ticket)
        if reached:  # the store did it; the answer was lost
            await lim.finish(decision.ticket, Cost(30, 0), "settle")
        lim.sending.pop(decision.ticket.id, None)  # the sending over, failed
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


async def test_restore_feeds_the_rebuild(make: Make) -> None:
    """A replica restarted from its journal adds the journal's usage to an empty store."""
    lim = make(policies(total_tokens_per_day=1000))
    now = time.time()
    assert await lim.restore([Usage(ACME, now - 1, Cost(250, 50, 3))], now) == 1
    await joined(lim)
    decision = await lim.reserve(ACME, Cost(0, 0), now)
    assert decision.tokens is not None
    assert decision.tokens.remaining == 700


async def test_three_replicas_share_one_budget_without_overshoot(make: Make) -> None:
    """Three limiters (one connection each) reserve 300 concurrent requests against one
    budget: the admitted tokens never exceed it, and the store's charge is what the
    replicas settled."""
    pols = policies(total_tokens_per_day=10_000)
    replicas = [make(pols, f"r{i}") for i in range(3)]
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


async def test_an_incomplete_generation_reserves_nothing_and_the_whole_sees_every_part(
    make: Make,
) -> None:
    """While a store found empty waits for replicas, nothing is reserved on it (each
    replica admits by its fail mode meanwhile, in process); once every replica expected
    has contributed, their parts (billed, and held in requests admitted without the
    store) are all in it."""
    pols = policies(prompt_tokens_per_day=300)
    one, two, three = (make(pols, f"r{i}", grace=60.0) for i in range(3))
    now = time.time()
    for lim in (one, two, three):
        await lim.restore([Usage(ACME, now - 1, Cost(90, 0))], now)
    assert await joined(one, known=3) == [False]
    with pytest.raises(Rebuilding) as raised:
        await one.reserve(ACME, Cost(1, 0), now)
    assert raised.value.contributed
    local = Ticket(ACME, Cost(10, 0))  # admitted in process meanwhile, still running
    three.holds["local"] = local
    assert await joined(two, three, known=3) == [False, True]
    over = await two.reserve(ACME, Cost(1, 0), now)  # 270 billed + 10 held by r2
    assert over.tokens is not None
    assert over.tokens.remaining == 19


async def test_a_cancelled_reservation_that_arrives_late_reserves_nothing(make: Make) -> None:
    """A reservation whose answer was lost is cancelled by its id: its holds are given
    back when it was made, and when the script reaches the store after the cancel it is
    refused whole (the gate of 1 stays free either way)."""
    lim = make(policies(concurrency=1))
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


async def test_a_settlement_carried_by_a_contribution_adds_nothing_when_it_lands(
    make: Make,
) -> None:
    """A settlement whose sending failed joins the replica's total; the contribution that
    carries it claims its id, so its first sending, landing afterwards, adds nothing
    (before: 30 billed were charged 60 until the day ended) and gives its hold back."""
    lim = make(policies(prompt_tokens_per_day=300))
    await joined(lim)
    now = time.time()
    decision = await lim.reserve(ACME, Cost(40, 0), now)
    ticket = decision.ticket
    assert isinstance(ticket, StoreTicket)
    lim.note(ticket, Cost(30, 0), now)
    lim.sending.pop(ticket.id)  # its sending failed: in this replica's total from now on
    lim.unclaimed[ticket.id] = ticket
    await joined(lim)
    assert not lim.unclaimed
    assert not await lim.finish(ticket, Cost(30, 0), "settle")  # the first sending lands
    after = await lim.reserve(ACME, Cost(0, 0), now)
    assert after.tokens is not None
    assert after.tokens.remaining == 270


async def test_live_holds_are_renewed_in_one_round_trip_and_a_dead_replicas_expire(
    make: Make,
) -> None:
    """Holds live 0.3 s. Replica r1 renews its two requests in flight every 0.1 s, in one
    script call each time for all four holds (two gates, two budgets); r2 (crashed) holds
    one and renews nothing. After 0.5 s r2's hold is given back and r1's are not: one
    more request fits the gate of 3 and the budget counts r1's two, then the gate is full."""
    pols = policies(total_tokens_per_day=100, concurrency=3)
    r1, r2 = make(pols, "r1", reservation_ttl=0.3), make(pols, "r2", reservation_ttl=0.3)
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
