"""Fixtures of the limits store's tests: limiters on the per-test redis-server, closed at
the end (the shared one alone, and guarded)."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from proxy.limits.policy import Policies
from proxy.limitstore.client import connect
from proxy.limitstore.redislimiter import RedisLimiter
from tests.support.limitstores import STORE_TIMEOUT, Guards, MakeGuarded, MakeShared
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
    guards = Guards()
    yield functools.partial(guards.build, redis_store.url)
    await guards.close()
