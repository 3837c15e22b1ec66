"""Where each limit lives in the store: a tenant's keys in one hash slot, each level's
parts with their kind and period, and keys that expire."""

from __future__ import annotations

import time

from redis.asyncio import Redis

from proxy.limits.limiter import Cost
from proxy.limitstore.keyspace import Keyspace
from tests.support.limitstores import ACME, MakeShared, joined, policies
from tests.support.redisserver import Store


async def test_keys_expire(make_shared: MakeShared, redis_store: Store) -> None:
    """Every key the limiter writes has an expiry (none lives forever)."""
    lim = make_shared(policies(total_tokens_per_day=100, total_tokens_per_minute=50, concurrency=2))
    await joined(lim)
    decision = await lim.reserve(ACME, Cost(5, 5), time.time())
    assert decision.ticket is not None
    await lim.settle(decision.ticket, Cost(5, 5), time.time())
    client = Redis.from_url(redis_store.url)
    keys = await client.keys("*")
    assert keys
    assert all([await client.ttl(k) > 0 for k in keys])
    await client.aclose()


def test_every_key_of_a_tenant_is_in_one_hash_slot() -> None:
    """Each level that applies is one part with its kind (rate, budget, gate), and every
    key carries the tenant as its hash tag, so one script may touch them all."""
    pols = policies(
        requests_per_minute=10,
        prompt_tokens_per_day=100,
        concurrency=2,
        models={"m": {"requests_per_minute": 5}},
    )
    keys = Keyspace("ns")
    parts = keys.parts(pols, ACME, 86_400 * 3 + 10)
    assert sorted((p.scope, p.kind) for p in parts) == [
        (("model", "acme", "m"), "r"),
        (("tenant", "acme"), "b"),
        (("tenant", "acme"), "g"),
        (("tenant", "acme"), "r"),
    ]
    assert all(p.key.startswith("ns:{acme}:") and p.holds == p.key + ":holds" for p in parts)
    (budget,) = [p for p in parts if p.kind == "b"]
    assert (budget.start, budget.span) == (86_400 * 3, 86_400 * 4)
    assert budget.key == keys.budget(("tenant", "acme"), budget.limit, budget.start)
