"""Helpers of the limits store's tests: the policies of one tenant, replicas with a
journal, three that billed 290 of 300, a burst of admissions, the TLS settings of a store
that speaks TLS only, an outage played by the breaker, and a budget as the store holds it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis

from proxy.limits.limiter import Cost, Ticket, Usage, Who
from proxy.limits.policy import FailMode, Policies
from proxy.limitstore.client import connect
from proxy.limitstore.guard import GuardedLimiter
from proxy.limitstore.redislimiter import RedisLimiter
from proxy.limitstore.wiring import build_shared_limiter
from proxy.serving.startup import store_password
from proxy.settings import Settings
from tests.support.redisserver import Store

ACME = Who("acme", "m", "k1")
UPSTREAM = "http://127.0.0.1:8000"
# The product's client (no retries), with room for a loaded box's round trips.
STORE_TIMEOUT = 5.0
TTL = 15.0  # the registry's TTL in service (3 heartbeats of 5 s)
MakeShared = Callable[..., RedisLimiter]
MakeGuarded = Callable[..., GuardedLimiter]


class Guards:
    """Guarded limiters (local fail mode, 1 s timeout unless told) on a store, each on the
    product's client; the fixtures close them all at the end of a test."""

    def __init__(self) -> None:
        self.made: list[GuardedLimiter] = []

    def build(
        self, url: str, pols: Policies, replica: str, *, grace: float = 60, **options: Any
    ) -> GuardedLimiter:
        shared = RedisLimiter(
            pols, connect(url, timeout=STORE_TIMEOUT), replica=replica, grace=grace
        )
        guarded = GuardedLimiter(shared, **{"timeout": 1.0, "fail_mode": FailMode.LOCAL, **options})
        self.made.append(guarded)
        return guarded

    async def close(self) -> None:
        for guarded in self.made:
            await guarded.close()


def policies(**tenant: object) -> Policies:
    """Policies with one tenant, acme, limited as ``tenant`` says."""
    return Policies.model_validate({"tenants": {"acme": tenant}})


async def billed_before(limiter: GuardedLimiter, prompt: int) -> None:
    """The replica's journal holds ``prompt`` tokens billed this period."""
    await limiter.restore([Usage(ACME, time.time() - 1, Cost(prompt, 0))], time.time())


async def three_after_290(make_guarded: MakeGuarded, pols: Policies) -> list[GuardedLimiter]:
    """Three replicas (the store's budgets whole before the first admission); r0 bills
    290 tokens through the store, then each heartbeat runs (every 5 s in service)."""
    replicas = [make_guarded(pols, f"r{i}", replicas=3) for i in range(3)]
    for replica in replicas:
        await replica.restore([], time.time())
        await replica.contribute()
    spent = await replicas[0].reserve(ACME, Cost(290, 0), time.time())
    assert spent.ticket is not None
    await replicas[0].settle(spent.ticket, Cost(290, 0), time.time())
    for replica in replicas:
        assert await replica.beat(15) is not None
    return replicas


async def acme_held(limiter: GuardedLimiter) -> int:
    """Reservations the store holds in acme's concurrency gates."""
    client = limiter.shared.client
    keys = [k for k in await client.keys("*acme*:holds") if b"concurrency" in k]
    return sum([await client.zcard(k) for k in keys])


async def joined(*limiters: RedisLimiter, known: int = 0) -> list[bool]:
    """Each replica contributes its journal to the store, in turn: whether the store's
    budgets were whole after each."""
    return [(await lim.sync(known, time.time())).complete for lim in limiters]


def tls_settings(store: Store, **options: Any) -> Settings:
    """The TLS handshake of a first connection can outlast the 50 ms default on this
    shared box: these tests allow a second."""
    return Settings(
        upstream=UPSTREAM,
        limits_store=store.url,
        instance="r0",
        **{"limits_store_timeout": 1.0, "limits_replicas": 1, **options},
    )


async def admitted_in_store(limiter: GuardedLimiter) -> bool:
    """Whether a reservation is made in the store (not by the fail mode)."""
    await limiter.restore([], time.time())
    try:
        whole = await limiter.contribute()
        decision = await limiter.reserve(ACME, Cost(5, 0), time.time())
        return whole and decision.ticket is not None and not limiter.calls.errors
    finally:
        await limiter.close()


async def burst(store: Store, mode: str) -> tuple[GuardedLimiter, list[Any], list[Any]]:
    """A healthy store; tenant ``evil`` (10 requests a minute) sends 1000 requests at
    once while tenant ``good`` (a roomy budget) sends 5: each admission's store wait
    decides. The timeout is 250 ms, not the 50 ms default: one round trip on a loaded
    2-core box can take longer than 50 ms (three in a row open the breaker, and the fail
    mode then admits the burst), while 1000 calls that wait for the pool inside their
    timeout (the defect) still time out by hundreds at 250 ms (measured: 593 of 1000)."""
    pols = Policies.model_validate(
        {
            "tenants": {
                "evil": {"requests_per_minute": 10},
                "good": {"prompt_tokens_per_day": 100_000},
            }
        }
    )
    settings = Settings(
        upstream=UPSTREAM,
        limits_store=store.url,
        limits_replicas=1,
        limits_fail_mode=mode,
        limits_store_timeout=0.25,
    )
    limiter = build_shared_limiter(settings, pols, password=store_password(settings))
    await limiter.restore([], time.time())
    assert await limiter.contribute()
    now = time.time()
    decisions = await asyncio.gather(
        *[limiter.reserve(Who("evil"), Cost(0, 0, 1), now) for _ in range(1000)],
        *[limiter.reserve(Who("good"), Cost(1, 0), now) for _ in range(5)],
    )
    await limiter.close()
    return limiter, list(decisions[:1000]), list(decisions[1000:])


def cut_off(limiter: GuardedLimiter, cut: bool) -> None:
    """The store skipped (the breaker open: unreachable for this replica), or back."""
    breaker = limiter.calls.breaker
    breaker.count = breaker.failures if cut else 0
    breaker.open_until = time.monotonic() + 600 if cut else 0.0


async def spend_locally(limiter: GuardedLimiter, units: int = 10) -> int:
    """Admit and bill ``units``-token requests until refused; the tokens admitted."""
    admitted = 0
    for _ in range(100):
        decision = await limiter.reserve(ACME, Cost(units, 0), time.time())
        if decision.ticket is None:
            break
        await limiter.settle(decision.ticket, Cost(units, 0), time.time())
        admitted += units
    return admitted


async def charge(store: Store, limiter: GuardedLimiter) -> list[int]:
    """acme's budget's ``used`` and ``reserved`` as the other replicas see them."""
    (budget,) = [p for p in limiter.shared.parts(ACME, time.time()) if p.kind == "b"]
    client = Redis.from_url(store.url)
    try:
        return [int(v or 0) for v in await client.hmget(budget.key, "used", "reserved")]
    finally:
        await client.aclose()


async def admin(redis_store: Store) -> Redis:
    return Redis.from_url(redis_store.url)


async def store_now(client: Redis) -> float:
    seconds, micros = await client.time()
    return float(seconds) + micros / 1e6


async def counted(redis_store: Store, replicas: list[GuardedLimiter]) -> None:
    """Every replica (--limits-replicas unset) in the registry, having stayed a whole TTL
    (its stay written back 100 s, as if it had beaten every 5 s since), and counted: its
    heartbeat has read the live count and what is left of each budget it watches."""
    for replica in replicas:  # each registers (a stay begins) and contributes
        assert await replica.beat(TTL) is not None
    client = await admin(redis_store)
    try:
        now = await store_now(client)
        since = {r.shared.replica: f"{now - 100:.6f}" for r in replicas}
        await client.hset(replicas[0].shared.keys.joined, mapping=since)
    finally:
        await client.aclose()
    for replica in replicas:
        assert await replica.beat(TTL) == len(replicas)
        assert replica.heartbeat.counted
        assert replica.mode.replicas == len(replicas)
        assert replica.mode.remainders.left  # what local fail mode divides


async def spend(limiter: GuardedLimiter, who: Who, units: int) -> Ticket:
    """``units`` reserved and billed through the store."""
    decision = await limiter.reserve(who, Cost(units, 0), time.time())
    assert decision.ticket is not None
    await limiter.settle(decision.ticket, Cost(units, 0), time.time())
    return decision.ticket
