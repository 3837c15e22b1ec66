"""Fixtures of the limits store's tests: limiters on the per-test redis-server, closed at
the end (the shared one alone, and guarded)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from proxy.limits.policy import FailMode, Policies
from proxy.limitstore.client import connect
from proxy.limitstore.guard import GuardedLimiter
from proxy.limitstore.redislimiter import RedisLimiter
from tests.support.limitstores import STORE_TIMEOUT, MakeGuarded, MakeShared
from tests.support.redisserver import Store


@pytest.fixture
async def make_shared(redis_store: Store) -> AsyncIterator[MakeShared]:
    clients: list[Redis] = []

    def build(pols: Policies, replica: str = "r1", **options: Any) -> RedisLimiter:
        client = connect(redis_store.url, timeout=STORE_TIMEOUT)
        clients.append(client)
        return RedisLimiter(pols, client, replica=replica, **{"grace": 0.0, **options})

    yield build
    for client in clients:
        await client.aclose()


@pytest.fixture
async def make_guarded(redis_store: Store) -> AsyncIterator[MakeGuarded]:
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
