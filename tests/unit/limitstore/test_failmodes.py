"""Each tenant's fail mode on a real redis-server while the store cannot answer: closed
refuses, open admits, local admits by this replica's share and refuses what it cannot
divide (no replica count, no remainder); a request beyond the share waits, not for
ever."""

from __future__ import annotations

import asyncio
import time

from redis.asyncio import Redis

from proxy.limits.limiter import Cost, Who
from proxy.limits.policy import FailMode, Policies
from proxy.limitstore.failmodes import UNCOUNTED
from proxy.limitstore.wiring import build_shared_limiter
from proxy.serving.startup import store_password
from proxy.settings import Settings
from tests.support.limitstores import ACME, UPSTREAM, MakeGuarded, billed_before, policies
from tests.support.redisserver import Store


async def test_a_rebuilding_store_admits_by_the_local_share(
    make_guarded: MakeGuarded, redis_store: Store
) -> None:
    """Three replicas billed 90 each of a 300 budget, and each heartbeat read the 30 left;
    the store restarts empty. While the generation waits for r1 and r2, r0 admits in
    process by its share of what was left (10, not the store's 210 with its part alone,
    nor 100 of the limit) and contributes what it admits at once; once every part is
    in, the store answers for the whole budget: 270 billed and r0's 10 held."""
    pols = policies(prompt_tokens_per_day=300)
    replicas = [make_guarded(pols, f"r{i}", replicas=3) for i in range(3)]
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
    assert r0.mode.fail_admissions[FailMode.LOCAL] == 2
    assert r0.contribution.rebuilds == 2  # the store found empty at the start, and now
    assert not r0.contribution.complete
    assert await replicas[1].contribute() is False
    assert await replicas[2].contribute() is True
    whole = await replicas[1].reserve(ACME, Cost(20, 0), time.time())
    assert whole.ticket is not None
    assert whole.tokens is not None
    assert whole.tokens.remaining == 0
    assert (await replicas[2].reserve(ACME, Cost(1, 0), time.time())).refusal is not None


async def test_a_budget_without_a_remainder_is_refused_not_guessed(
    make_guarded: MakeGuarded, redis_store: Store
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
    limiter, *others = [make_guarded(pols, f"r{i}", replicas=3) for i in range(3)]
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
    make_guarded: MakeGuarded, redis_store: Store
) -> None:
    """--limits-replicas unset: a replica divides by the live count only once it has
    stayed a whole registry TTL in the store (every replica that stayed as long is in
    that count). Before, it refuses in an outage (it used to divide by what its first
    heartbeat saw: 1 for the first replica up, which then admitted the whole budget);
    after, it divides."""
    pols = policies(prompt_tokens_per_day=300)
    one, two = make_guarded(pols, "r0"), make_guarded(pols, "r1")
    for replica in (one, two):
        replica.shared.grace = 0.5  # a whole generation without a declared count
        await replica.restore([], time.time())
    assert await one.beat(1.0) == 1  # alone so far, for all it knows
    assert not one.heartbeat.counted
    assert one.problem() is not None
    assert await two.beat(1.0) == 2
    for _ in range(3):
        await asyncio.sleep(0.4)
        for replica in (one, two):
            assert await replica.beat(1.0) == 2
    assert one.heartbeat.counted
    assert one.mode.replicas == 2
    assert one.problem() is None
    fresh = make_guarded(pols, "r2")
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


async def test_a_closed_tenant_is_refused_while_the_store_rebuilds(
    make_guarded: MakeGuarded,
) -> None:
    """A tenant whose limits fail closed gets a 503 refusal while the store's budgets are
    incomplete, though the store answers."""
    pols = Policies.model_validate(
        {"tenants": {"acme": {"fail_mode": "closed", "prompt_tokens_per_day": 300}}}
    )
    limiter = make_guarded(pols, "r0", replicas=2)
    await limiter.restore([], time.time())
    decision = await limiter.reserve(ACME, Cost(1, 0), time.time())
    assert decision.refusal is not None
    assert decision.refusal.unavailable
    assert limiter.mode.fail_admissions[FailMode.CLOSED] == 1


async def test_each_tenant_fails_by_its_own_mode(
    make_guarded: MakeGuarded, redis_store: Store
) -> None:
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
    limiter, other = make_guarded(pols, "r0", replicas=2), make_guarded(pols, "r1", replicas=2)
    for replica in (limiter, other):
        await replica.restore([], time.time())
        await replica.contribute()
    assert await limiter.beat(15) is not None  # what is left of each named budget
    redis_store.kill()
    now = time.time()
    opened = [await limiter.reserve(Who("acme"), Cost(40, 0), now) for _ in range(4)]
    assert all(d.ticket is not None for d in opened)  # 160 > 100: open admits
    closed = await limiter.reserve(Who("globex"), Cost(1, 0), now)
    assert closed.refusal is not None
    assert closed.refusal.unavailable
    local = [await limiter.reserve(Who("initech"), Cost(20, 0), now) for _ in range(3)]
    assert [d.ticket is not None for d in local] == [True, True, False]  # a share of 50
    assert limiter.mode.fail_admissions == {FailMode.OPEN: 4, FailMode.CLOSED: 1, FailMode.LOCAL: 3}


async def test_a_request_within_the_budget_is_not_refused_for_ever_in_an_outage(
    make_guarded: MakeGuarded, redis_store: Store
) -> None:
    """300 tokens a day, three replicas, the store down: a 150-token request is more than
    this replica's share (100) but fits the budget; the refusal must be one to retry
    (not ``alone``, which admission answers 400 'can never be admitted')."""
    pols = policies(prompt_tokens_per_day=300)
    limiter, *others = [make_guarded(pols, f"r{i}", replicas=3) for i in range(3)]
    for replica in (limiter, *others):
        await replica.restore([], time.time())
        await replica.contribute()
    assert await limiter.beat(15) is not None  # 300 left
    redis_store.kill()
    decision = await limiter.reserve(ACME, Cost(150, 0), time.time())
    assert decision.refusal is not None
    assert not decision.refusal.alone
    assert not decision.refusal.unavailable


async def test_one_slow_admission_does_not_fail_readiness(redis_store: Store) -> None:
    """Fail mode closed, the store up: it pauses its clients for 100 ms once (CLIENT
    PAUSE), so one admission outlasts the 50 ms timeout; /readyz must not call the store
    unreachable for that."""
    settings = Settings(
        upstream=UPSTREAM,
        limits_store=redis_store.url,
        limits_replicas=1,
        limits_fail_mode="closed",
    )
    limiter = build_shared_limiter(
        settings, policies(requests_per_minute=100), password=store_password(settings)
    )
    admin = Redis.from_url(redis_store.url)
    try:
        await limiter.restore([], time.time())
        assert await limiter.contribute()
        assert await limiter.beat(15.0) == 1
        await admin.execute_command("CLIENT", "PAUSE", 100, "ALL")
        slow = await limiter.reserve(ACME, Cost(0, 0, 1), time.time())
        found = limiter.problem()
    finally:
        await admin.aclose()
        await limiter.close()
    assert slow.refusal is not None  # the pause made it time out: decided by the fail mode
    assert found is None or not found[1]
