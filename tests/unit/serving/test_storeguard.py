"""The guarded shared limiter on a real redis-server: while the store's budgets are being
rebuilt (it was found empty) nothing is reserved on it and each tenant's fail mode
decides, by this replica's share; usage billed without the store is contributed to it
once; each tenant fails by its own mode."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from redis.asyncio import Redis

from proxy.limits.limiter import Cost, Usage, Who
from proxy.limits.policy import FailMode, Policies
from proxy.limitstore.client import connect
from proxy.limitstore.failmodes import UNCOUNTED
from proxy.limitstore.guard import GuardedLimiter
from proxy.limitstore.redislimiter import RedisLimiter
from tests.support.redisserver import Store

ACME = Who("acme", "m", "k1")
UPSTREAM = "http://127.0.0.1:8000"
Make = Callable[..., GuardedLimiter]


def policies(**tenant: object) -> Policies:
    return Policies.model_validate({"tenants": {"acme": tenant}})


@pytest.fixture
async def make(redis_store: Store) -> AsyncIterator[Make]:
    made: list[GuardedLimiter] = []

    def build(pols: Policies, replica: str, **options: Any) -> GuardedLimiter:
        shared = RedisLimiter(
            pols, connect(redis_store.url, timeout=5.0), replica=replica, grace=60
        )
        guarded = GuardedLimiter(shared, **{"timeout": 1.0, "fail_mode": FailMode.LOCAL, **options})
        made.append(guarded)
        return guarded

    yield build
    for guarded in made:
        await guarded.close()


async def billed_before(limiter: GuardedLimiter, prompt: int) -> None:
    """The replica's journal holds ``prompt`` tokens billed this period."""
    await limiter.restore([Usage(ACME, time.time() - 1, Cost(prompt, 0))], time.time())


async def test_a_rebuilding_store_admits_by_the_local_share(make: Make, redis_store: Store) -> None:
    """Three replicas billed 90 each of a 300 budget, and each heartbeat read the 30 left;
    the store restarts empty. While the generation waits for r1 and r2, r0 admits in
    process by its share of what was left (10, not the store's 210 with its part alone,
    nor 100 of the limit) and contributes what it admits at once; once every part is
    in, the store answers for the whole budget: 270 billed and r0's 10 held."""
    pols = policies(prompt_tokens_per_day=300)
    replicas = [make(pols, f"r{i}", replicas=3) for i in range(3)]
    for replica in replicas:
        await billed_before(replica, 90)
        await replica.contribute()
    for replica in replicas:
        assert await replica.beat(15) is not None  # reads the 30 left
    r0 = replicas[0]
    await r0.shared.client.flushall()  # the store restarted empty
    assert await r0.contribute() is False
    over = await r0.reserve(ACME, Cost(11, 0), time.time())
    assert over.refusal is not None
    assert not over.refusal.unavailable  # beyond the share: to retry
    held = await r0.reserve(ACME, Cost(10, 0), time.time())
    assert held.ticket is not None
    assert r0.fail_admissions[FailMode.LOCAL] == 2
    assert r0.rebuilds == 2  # the store found empty at the start, and now
    assert not r0.complete
    assert await replicas[1].contribute() is False
    assert await replicas[2].contribute() is True
    whole = await replicas[1].reserve(ACME, Cost(20, 0), time.time())
    assert whole.ticket is not None
    assert whole.tokens is not None
    assert whole.tokens.remaining == 0
    assert (await replicas[2].reserve(ACME, Cost(1, 0), time.time())).refusal is not None


async def test_a_budget_without_a_remainder_is_refused_not_guessed(
    make: Make, redis_store: Store
) -> None:
    """The store dies before it told this replica what was left of a budget (a tenant on
    the default limits it never served): whatever the other replicas spent is unknown,
    so local mode refuses it, 503 to retry in a second, and says why, where it used to
    admit the limit's share against its own usage (a replica that had billed nothing
    while another billed 290 of 300 admitted 100 more). A budget it holds a remainder of
    is divided as before."""
    pols = Policies.model_validate(
        {"default": {"prompt_tokens_per_day": 300}, "tenants": {"acme": {"requests_per_day": 9}}}
    )
    limiter, *others = [make(pols, f"r{i}", replicas=3) for i in range(3)]
    for replica in (limiter, *others):
        await replica.restore([], time.time())
        await replica.contribute()
    assert await limiter.beat(15) is not None  # acme is named: its remainder is read
    redis_store.kill()
    stranger = await limiter.reserve(Who("bob"), Cost(1, 0), time.time())
    assert stranger.refusal is not None
    assert stranger.refusal.unavailable
    assert stranger.refusal.wait >= 1.0
    assert "no remainder" in stranger.refusal.why
    named = [await limiter.reserve(ACME, Cost(1, 0), time.time()) for _ in range(4)]
    assert [d.ticket is not None for d in named] == [True, True, True, False]


async def test_a_replica_not_yet_counted_refuses_in_an_outage(
    make: Make, redis_store: Store
) -> None:
    """--limits-replicas unset: a replica divides by the live count only once it has
    stayed a whole registry TTL in the store (every replica that stayed as long is in
    that count). Before, it refuses in an outage (it used to divide by what its first
    heartbeat saw: 1 for the first replica up, which then admitted the whole budget);
    after, it divides."""
    pols = policies(prompt_tokens_per_day=300)
    one, two = make(pols, "r0"), make(pols, "r1")
    for replica in (one, two):
        replica.shared.grace = 0.5  # a whole generation without a declared count
        await replica.restore([], time.time())
    assert await one.beat(1.0) == 1  # alone so far, for all it knows
    assert not one.counted
    assert one.problem() is not None
    assert await two.beat(1.0) == 2
    for _ in range(3):
        await asyncio.sleep(0.4)
        for replica in (one, two):
            assert await replica.beat(1.0) == 2
    assert one.counted
    assert one.replicas == 2
    assert one.problem() is None
    fresh = make(pols, "r2")
    await fresh.restore([], time.time())
    assert await fresh.beat(1.0) == 3
    redis_store.kill()
    refused = await fresh.reserve(ACME, Cost(1, 0), time.time())
    assert refused.refusal is not None
    assert refused.refusal.unavailable
    assert "replica count is not known" in refused.refusal.why
    assert await fresh.beat(1.0) is None  # its heartbeat fails too: readiness says so
    assert fresh.problem() == (f"unreachable: limited tenants refused: {UNCOUNTED}", True)
    admitted = await one.reserve(ACME, Cost(150, 0), time.time())
    assert admitted.ticket is not None  # half of the 300 the store said were left
    assert (await one.reserve(ACME, Cost(1, 0), time.time())).refusal is not None


async def test_a_closed_tenant_is_refused_while_the_store_rebuilds(make: Make) -> None:
    """A tenant whose limits fail closed gets a 503 refusal while the store's budgets are
    incomplete, though the store answers."""
    pols = Policies.model_validate(
        {"tenants": {"acme": {"fail_mode": "closed", "prompt_tokens_per_day": 300}}}
    )
    limiter = make(pols, "r0", replicas=2)
    await limiter.restore([], time.time())
    decision = await limiter.reserve(ACME, Cost(1, 0), time.time())
    assert decision.refusal is not None
    assert decision.refusal.unavailable
    assert limiter.fail_admissions[FailMode.CLOSED] == 1


async def test_usage_billed_without_the_store_is_contributed_once(
    make: Make, redis_store: Store
) -> None:
    """Admitted by the local share while the store is down, then settled: the store
    started again empty is charged what the journal billed, the outage's record included,
    once however often the replica contributes."""
    pols = policies(prompt_tokens_per_day=300)
    limiter = make(pols, "r0", replicas=1)
    await billed_before(limiter, 40)
    assert await limiter.contribute() is True
    redis_store.kill()
    decision = await limiter.reserve(ACME, Cost(25, 0), time.time())
    assert decision.ticket is not None
    assert limiter.errors
    await limiter.settle(decision.ticket, Cost(25, 0), time.time())
    assert limiter.dirty
    redis_store.start()
    limiter.breaker.open_until = 0.0
    assert await limiter.contribute() is True
    assert await limiter.contribute() is True
    after = await limiter.reserve(ACME, Cost(0, 0), time.time())
    assert after.tokens is not None
    assert after.tokens.remaining == 300 - 65


async def test_an_open_reservation_without_the_store_counts_in_the_rebuild(
    make: Make, redis_store: Store
) -> None:
    """A request admitted without the store and still in flight when the store is rebuilt
    is held in this replica's part, so the others cannot spend it meanwhile."""
    pols = policies(prompt_tokens_per_day=300)
    limiter = make(pols, "r0", replicas=1)
    await limiter.restore([], time.time())
    assert await limiter.contribute() is True
    redis_store.kill()
    decision = await limiter.reserve(ACME, Cost(50, 0), time.time())
    assert decision.ticket is not None
    redis_store.start()
    limiter.breaker.open_until = 0.0
    assert await limiter.contribute() is True
    during = await limiter.reserve(ACME, Cost(0, 0), time.time())
    assert during.tokens is not None
    assert during.tokens.remaining == 250


async def test_each_tenant_fails_by_its_own_mode(make: Make, redis_store: Store) -> None:
    """With the store down, a tenant with ``fail_mode: open`` in the limits file is
    admitted beyond any share (and counted), one with ``closed`` is refused (503), and
    one without falls back to --limits-fail-mode (local: half of 100 with 2 replicas)."""
    pols = Policies.model_validate(
        {
            "tenants": {
                "acme": {"fail_mode": "open", "prompt_tokens_per_day": 100},
                "globex": {"fail_mode": "closed", "prompt_tokens_per_day": 100},
                "initech": {"prompt_tokens_per_day": 100},
            }
        }
    )
    limiter = make(pols, "r0", replicas=2)
    await limiter.restore([], time.time())
    redis_store.kill()
    now = time.time()
    opened = [await limiter.reserve(Who("acme"), Cost(40, 0), now) for _ in range(4)]
    assert all(d.ticket is not None for d in opened)  # 160 > 100: open admits
    closed = await limiter.reserve(Who("globex"), Cost(1, 0), now)
    assert closed.refusal is not None
    assert closed.refusal.unavailable
    local = [await limiter.reserve(Who("initech"), Cost(20, 0), now) for _ in range(3)]
    assert [d.ticket is not None for d in local] == [True, True, False]  # a share of 50
    assert limiter.fail_admissions == {FailMode.OPEN: 4, FailMode.CLOSED: 1, FailMode.LOCAL: 3}


async def test_usage_billed_while_the_store_was_skipped_is_contributed_when_back(
    make: Make,
) -> None:
    """The store keeps its state but this replica could not reach it (the breaker open):
    what it admitted and billed meanwhile by its share is added to the store's charge when
    it answers again, once."""
    pols = policies(prompt_tokens_per_day=300)
    limiter = make(pols, "r0", replicas=1)
    await limiter.restore([], time.time())
    assert await limiter.contribute() is True
    limiter.breaker.count, limiter.breaker.open_until = 3, time.monotonic() + 60
    decision = await limiter.reserve(ACME, Cost(30, 0), time.time())
    assert decision.ticket is not None
    assert limiter.fail_admissions[FailMode.LOCAL] == 1
    await limiter.settle(decision.ticket, Cost(30, 0), time.time())
    limiter.breaker.open_until = 0.0  # half open: the next call tries the store
    after = await limiter.reserve(ACME, Cost(0, 0), time.time())
    assert after.ticket is not None
    assert await limiter.contribute() is True
    assert await limiter.contribute() is True
    again = await limiter.reserve(ACME, Cost(0, 0), time.time())
    assert again.tokens is not None
    assert again.tokens.remaining == 270


# --- review (adversarial): local fail mode overshoots the budget during an outage ---


async def three_after_290(make: Make, pols: Policies) -> list[GuardedLimiter]:
    """Three replicas (the store's budgets whole before the first admission); r0 bills
    290 tokens through the store, then each heartbeat runs (every 5 s in service)."""
    replicas = [make(pols, f"r{i}", replicas=3) for i in range(3)]
    for replica in replicas:
        await replica.restore([], time.time())
        await replica.contribute()
    spent = await replicas[0].reserve(ACME, Cost(290, 0), time.time())
    assert spent.ticket is not None
    await replicas[0].settle(spent.ticket, Cost(290, 0), time.time())
    for replica in replicas:
        assert await replica.beat(15) is not None
    return replicas


async def test_review_local_mode_keeps_the_total_within_the_budget(
    make: Make, redis_store: Store
) -> None:
    """Three replicas share 300 tokens a day; one billed 290 of them through the store,
    and each heartbeat ran after it (every 5 s in service). The store goes away: together
    the replicas may admit at most the 10 that are left."""
    pols = policies(prompt_tokens_per_day=300)
    replicas = await three_after_290(make, pols)
    redis_store.kill()
    admitted = 0
    for replica in replicas:
        for _ in range(10):
            decision = await replica.reserve(ACME, Cost(10, 0), time.time())
            admitted += 10 if decision.ticket is not None else 0
    assert 290 + admitted <= 300


async def test_review_replicas_started_during_an_outage_do_not_each_get_the_whole_budget(
    make: Make, redis_store: Store
) -> None:
    """Three replicas (--limits-replicas unset, the default) start while the store is
    down, fail mode local: together they must not admit more than the budget."""
    redis_store.kill()
    pols = policies(prompt_tokens_per_day=300)
    replicas = [make(pols, f"r{i}") for i in range(3)]
    admitted = 0
    for replica in replicas:
        await replica.restore([], time.time())
        decision = await replica.reserve(ACME, Cost(300, 0), time.time())
        admitted += 300 if decision.ticket is not None else 0
    assert admitted <= 300


async def test_review_a_request_within_the_budget_is_not_refused_for_ever_in_an_outage(
    make: Make, redis_store: Store
) -> None:
    """300 tokens a day, three replicas, the store down: a 150-token request is more than
    this replica's share (100) but fits the budget; the refusal must be one to retry
    (not ``alone``, which admission answers 400 'can never be admitted')."""
    pols = policies(prompt_tokens_per_day=300)
    limiter, *others = [make(pols, f"r{i}", replicas=3) for i in range(3)]
    for replica in (limiter, *others):
        await replica.restore([], time.time())
        await replica.contribute()
    assert await limiter.beat(15) is not None  # 300 left
    redis_store.kill()
    decision = await limiter.reserve(ACME, Cost(150, 0), time.time())
    assert decision.refusal is not None
    assert not decision.refusal.alone
    assert not decision.refusal.unavailable


async def test_review_a_release_missed_during_a_blip_does_not_hold_the_gate(
    make: Make,
) -> None:
    """concurrency 1: a request admitted by the store ends while the breaker is open (its
    release cannot reach the store); once the store answers again the tenant's next
    request is admitted, not refused by the finished request's hold."""
    limiter = make(policies(concurrency=1), "r0", replicas=1)
    await limiter.restore([], time.time())
    assert await limiter.contribute() is True
    first = await limiter.reserve(ACME, Cost(0, 0), time.time())
    assert first.ticket is not None
    limiter.breaker.count, limiter.breaker.open_until = 3, time.monotonic() + 60
    await limiter.release(first.ticket, time.time())  # the store is skipped
    limiter.breaker.count, limiter.breaker.open_until = 0, 0.0  # the blip is over
    second = await limiter.reserve(ACME, Cost(0, 0), time.time())
    assert second.ticket is not None


async def acme_held(limiter: GuardedLimiter) -> int:
    """Reservations the store holds in acme's concurrency gates."""
    client = limiter.shared.client
    keys = [k for k in await client.keys("*acme*:holds") if b"concurrency" in k]
    return sum([await client.zcard(k) for k in keys])


async def test_missed_ends_are_sent_again_in_the_background(make: Make) -> None:
    """A release missed while the breaker was open is sent again once the store answers
    another tenant's admission, so the tenant's hold is gone before it asks again."""
    pols = Policies.model_validate(
        {"tenants": {"acme": {"concurrency": 1}, "globex": {"concurrency": 5}}}
    )
    limiter = make(pols, "r0", replicas=1)
    await limiter.restore([], time.time())
    assert await limiter.contribute() is True
    first = await limiter.reserve(ACME, Cost(0, 0), time.time())
    assert first.ticket is not None
    limiter.breaker.count, limiter.breaker.open_until = 3, time.monotonic() + 60
    await limiter.release(first.ticket, time.time())
    assert len(limiter.missed) == 1
    assert await acme_held(limiter) == 1  # the store still holds it
    limiter.breaker.count, limiter.breaker.open_until = 0, 0.0
    other = await limiter.reserve(Who("globex"), Cost(0, 0), time.time())
    assert other.ticket is not None
    assert limiter._replaying is not None
    await limiter._replaying
    assert limiter.missed == {}
    assert await acme_held(limiter) == 0


async def test_a_settlement_on_its_way_to_the_store_is_not_counted_twice(make: Make) -> None:
    """6 tokens a day, one store slot: A (3) is admitted; B (3) waits for the slot, then
    A's settlement queues behind it. B must be admitted (3 settled + 3 reserved = 6): A's
    3 tokens were counted twice, once in this replica's part (its history, read by B's
    reservation) and once in the store's ``reserved`` (A's settlement not yet there), and
    B was refused with the budget not spent (seen under load: 147 of 150 admitted)."""
    limiter = make(policies(prompt_tokens_per_day=6), "r0", replicas=1, slots=1)
    await limiter.restore([], time.time())
    assert await limiter.contribute() is True
    first = await limiter.reserve(ACME, Cost(3, 0), time.time())
    assert first.ticket is not None
    await limiter.slots.acquire()  # the one slot busy: B queues first, A's settlement next
    second = asyncio.create_task(limiter.reserve(ACME, Cost(3, 0), time.time()))
    await asyncio.sleep(0)
    settled = asyncio.create_task(limiter.settle(first.ticket, Cost(3, 0), time.time()))
    await asyncio.sleep(0)
    limiter.slots.release()
    decision = await second
    await settled
    assert decision.ticket is not None, decision.refusal
    assert decision.tokens is not None
    assert decision.tokens.remaining == 0
    await limiter.settle(decision.ticket, Cost(3, 0), time.time())
    after = await limiter.reserve(ACME, Cost(0, 0), time.time())
    assert after.tokens is not None
    assert after.tokens.remaining == 0  # 6 billed in all, nothing counted twice or lost


async def test_a_settlement_skipped_by_the_open_breaker_is_contributed(
    make: Make, redis_store: Store
) -> None:
    """A store reservation settled while the breaker is open: the settlement is not sent
    (kept to send again, late, to give its hold back) and is in this replica's total from
    then on, so the contribution when the store is back carries it, even when it reaches
    the store before the settlement sent again."""
    limiter = make(policies(prompt_tokens_per_day=300), "r0", replicas=1)
    await limiter.restore([], time.time())
    assert await limiter.contribute() is True
    decision = await limiter.reserve(ACME, Cost(40, 0), time.time())
    assert decision.ticket is not None
    limiter.breaker.count, limiter.breaker.open_until = 3, time.monotonic() + 60
    await limiter.settle(decision.ticket, Cost(30, 0), time.time())
    assert limiter.missed
    limiter.breaker.count, limiter.breaker.open_until = 0, 0.0  # the store answers again
    assert await limiter.contribute() is True  # before the settlement sent again
    await limiter._replay(None)
    assert not limiter.missed
    (budget,) = limiter.shared.budgets(time.time())
    client = Redis.from_url(redis_store.url)
    try:  # read as the other replicas see it (this one's next reservation carries its total)
        charge = await client.hmget(budget.key, "used", "reserved")
    finally:
        await client.aclose()
    assert [int(v or 0) for v in charge] == [30, 0]


async def test_local_mode_divides_what_was_left_not_the_replicas_own_usage(
    make: Make, redis_store: Store
) -> None:
    """1,000 tokens a day, three replicas; r0 billed 290 through the store and the
    heartbeats read 710 left. In the outage r1 (which billed nothing) may admit a third of
    those 710 (236), not the limit's third (333), and a request beyond its room but
    within the 710 is refused to retry soon, not for the day; r0 is held to the smaller
    of its two shares: the limit's third less its own 290 (43)."""
    pols = policies(prompt_tokens_per_day=1000)
    replicas = await three_after_290(make, pols)
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
    make: Make, redis_store: Store
) -> None:
    """One replica, 300 a day. With the breaker open it admits 100 locally (held, not yet
    in the store); a heartbeat meanwhile reads 300 left in the store, which does not
    count them, so it keeps its older remainder: in the outage that follows it admits
    at most 200 more, not 300."""
    limiter = make(policies(prompt_tokens_per_day=300), "r0", replicas=1)
    await limiter.restore([], time.time())
    assert await limiter.contribute() is True
    assert await limiter.beat(15) is not None  # reads 300 left
    limiter.breaker.count, limiter.breaker.open_until = 3, time.monotonic() + 60
    held = await limiter.reserve(ACME, Cost(100, 0), time.time())
    assert held.ticket is not None
    assert await limiter.beat(15) is not None  # the heartbeat reaches the store
    redis_store.kill()
    more = await limiter.reserve(ACME, Cost(150, 0), time.time())
    assert more.ticket is not None
    over = await limiter.reserve(ACME, Cost(60, 0), time.time())
    assert over.refusal is not None


async def test_a_remainder_read_earlier_does_not_replace_a_later_one(
    make: Make, redis_store: Store
) -> None:
    """Answers on separate connections can be read out of order: a remainder the store
    told earlier (a heartbeat's read before a burst, its answer read after it) does not
    replace the later one, so the outage share is of what was left last (seen under
    load: three replicas admitted 327 of 300)."""
    pols = policies(prompt_tokens_per_day=300)
    limiter = make(pols, "r0", replicas=1)
    await limiter.restore([], time.time())
    assert await limiter.contribute() is True
    early: dict[str, tuple[int, float, Any]] = {}
    ticket = limiter.shared.ticket(ACME, Cost(0, 0), time.time())
    first = await limiter.shared.reserve_ticket(ticket, early)
    assert first.ticket is not None
    spent = await limiter.reserve(ACME, Cost(200, 0), time.time())
    assert spent.ticket is not None
    limiter._remember(early, limiter.seq)  # the earlier answer (300 left) read last
    redis_store.kill()
    more = await limiter.reserve(ACME, Cost(150, 0), time.time())
    assert more.refusal is not None  # 100 were left, not 300
    fits = await limiter.reserve(ACME, Cost(100, 0), time.time())
    assert fits.ticket is not None


async def test_an_ended_request_is_no_longer_renewed(make: Make) -> None:
    """The guard's settle or release (store reachable or not) stops the renewal of the
    request's holds: the store gives them back, or they expire by their TTL."""
    limiter = make(policies(concurrency=2), "r0", replicas=1)
    await limiter.restore([], time.time())
    assert await limiter.contribute() is True
    first = await limiter.reserve(ACME, Cost(0, 0), time.time())
    second = await limiter.reserve(ACME, Cost(0, 0), time.time())
    assert first.ticket is not None
    assert second.ticket is not None
    assert await limiter.renew() == 2
    await limiter.release(first.ticket, time.time())
    limiter.breaker.count, limiter.breaker.open_until = 3, time.monotonic() + 60
    await limiter.release(second.ticket, time.time())  # missed: kept to send again
    assert limiter.shared.live == {}
    assert await limiter.renew() == 0


async def test_a_store_back_from_an_old_snapshot_is_rebuilt(make: Make, redis_store: Store) -> None:
    """300 tokens a day: 100 billed, the store snapshotted (SAVE), 150 more billed, then it
    restarts from that snapshot, its generation marker whole but the 150 lost. The
    heartbeat sees a store that restarted, starts a new generation and contributes this
    replica's journal: the store charges the 250 again (the rebuild counted)."""
    limiter = make(policies(prompt_tokens_per_day=300), "r0", replicas=1)
    await limiter.restore([], time.time())
    assert await limiter.contribute() is True
    assert await limiter.beat(15) == 1

    async def spend(units: int) -> None:
        decision = await limiter.reserve(ACME, Cost(units, 0), time.time())
        assert decision.ticket is not None
        await limiter.settle(decision.ticket, Cost(units, 0), time.time())

    async def charged() -> int:
        (budget,) = limiter.shared.budgets(time.time())
        client = Redis.from_url(redis_store.url)
        try:
            return int(await client.hget(budget.key, "used") or 0)
        finally:
            await client.aclose()

    await spend(100)
    admin = Redis.from_url(redis_store.url)
    await admin.save()
    await admin.aclose()
    await spend(150)
    rebuilds = limiter.rebuilds
    redis_store.kill()
    redis_store.start()  # from the snapshot: 100 charged, the generation whole
    assert await charged() == 100
    for _ in range(3):  # the first call may find its pooled connection gone
        if await limiter.beat(15) is not None:
            break
    assert await charged() == 250
    assert limiter.rebuilds == rebuilds + 1
