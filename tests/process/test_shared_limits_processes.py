"""Issue #40's done-when with real processes: three ``usage-proxy serve`` processes (each
its own journal and store connections) in front of one fake vLLM process share one tenant
budget on a real redis-server. 300 concurrent requests spread over them: the engine's own
prompt counter grows by no more than the budget (zero overshoot), and the three journals
add up to the store's charge. (tests/app/test_shared_limits.py holds the outage cases with
three apps in one process.)"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import yaml
from redis.asyncio import Redis

from scripts.vllm_cpu import Process, metric, start_proxy
from tests.support.processes import readiness
from tests.support.records import journal_records
from tests.support.redisserver import Store

ACME = {"X-Tenant-Id": "acme"}
EMBED = {"input": "hi"}  # 3 prompt tokens with MiniLM
BUDGET = 450  # 150 requests


def whole(body: dict[str, object]) -> bool:
    """Whether the replica is ready and sees the store's budgets whole (no rebuild)."""
    problems = body["problems"]
    return body["status"] == "ready" and isinstance(problems, dict) and not problems


async def dump(store: Store) -> dict[bytes, object]:
    """The store's hashes and sorted sets, for a failure's message."""
    client = Redis.from_url(store.url)
    try:
        found: dict[bytes, object] = {}
        async for key in client.scan_iter():
            kind = await client.type(key)
            if kind == b"hash":
                found[key] = await client.hgetall(key)
            elif kind == b"zset":
                found[key] = await client.zrange(key, 0, -1, withscores=True)
        return found
    finally:
        await client.aclose()


async def charged(store: Store) -> int:
    """What the store charges across its budget hashes (each hash's ``used``)."""
    client = Redis.from_url(store.url)
    try:
        total = 0
        async for key in client.scan_iter(count=1000):
            if await client.type(key) == b"hash" and await client.hexists(key, "used"):
                total += int(await client.hget(key, "used") or 0)
        return total
    finally:
        await client.aclose()


@contextlib.contextmanager
def three_replicas(
    fake: Process, store: Store, tmp: Path, tenants: dict[str, object], *options: str
) -> Iterator[list[Process]]:
    """Three ``usage-proxy serve`` processes (each its own journal) on one store, with
    ``tenants``' limits, ready; stopped (SIGTERM: a graceful stop flushes the journal)."""
    limits = tmp / "limits.yaml"
    limits.write_text(yaml.safe_dump({"tenants": tenants}))
    proxies: list[Process] = []
    try:
        for i in range(3):
            work = tmp / f"replica{i}"
            work.mkdir()
            proxies.append(
                start_proxy(
                    fake.url,
                    work,
                    *("--journal", str(work / "j.sqlite"), "--instance", f"replica{i}"),
                    *("--tenant-header", "X-Tenant-Id", "--limits", str(limits)),
                    *("--limits-store", store.url, *options),
                )
            )
        for proxy in proxies:
            proxy.wait_ready("/readyz", 60)
        yield proxies
    finally:
        for proxy in proxies:
            proxy.stop()


async def test_three_proxy_processes_share_one_budget(
    fake_upstream: Process, redis_store: Store, tmp_path: Path
) -> None:
    """Zero overshoot at the engine, every admitted request journaled once, the store's
    charge equal to the journals' sum, over three processes."""
    tenants: dict[str, object] = {"acme": {"prompt_tokens_per_day": BUDGET}}
    # a store answer late on this loaded 2-core box is a 503, never a pass
    closed = ("--limits-replicas", "3", "--limits-fail-mode", "closed")
    with three_replicas(
        fake_upstream, redis_store, tmp_path, tenants, *closed, "--limits-store-timeout", "2"
    ) as proxies:
        deadline = time.monotonic() + 30
        while not all(whole(body := readiness(p)) for p in proxies):
            if time.monotonic() > deadline:
                raise AssertionError((body, await dump(redis_store)))
            await asyncio.sleep(0.2)
        before = metric(fake_upstream.url)

        async def post(session: aiohttp.ClientSession, url: str) -> int:
            async with session.post(url + "/v1/embeddings", json=EMBED, headers=ACME) as resp:
                await resp.read()
                return resp.status

        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            statuses = await asyncio.gather(
                *(post(session, proxies[i % 3].url) for i in range(300))
            )
        engine = metric(fake_upstream.url) - before
        admitted = statuses.count(200)
        assert set(statuses) <= {200, 429, 503}, statuses
        assert engine == 3 * admitted <= BUDGET
        assert admitted >= 100  # the budget is used, not refused wholesale
    journaled = [r for i in range(3) for r in journal_records(tmp_path / f"replica{i}/j.sqlite")]
    assert len(journaled) == admitted
    assert sum(r.prompt_tokens_billed or 0 for r in journaled) == engine
    assert await charged(redis_store) == engine


# --- issue #52: the store dies early, comes back empty, or dies twice (local fail mode) ---

BOB = {"X-Tenant-Id": "bob"}
# 25 engine tokens with MiniLM (bi-encoder: the query and each document once): 9 + 9 + 7.
RERANK = {
    "query": "What is the capital of France?",
    "documents": ["Paris is the capital of France.", "Berlin is in Germany."],
}
MONTH = 762  # 30 such reranks and a little


def local_replicas(
    fake: Process, store: Store, tmp: Path, *options: str
) -> contextlib.AbstractContextManager[list[Process]]:
    """Three replicas in local fail mode, tenant bob on a monthly budget of MONTH total
    tokens."""
    tenants: dict[str, object] = {"bob": {"total_tokens_per_month": MONTH}}
    local = ("--limits-fail-mode", "local", "--limits-store-timeout", "0.5")
    return three_replicas(fake, store, tmp, tenants, *local, *options)


async def until_whole(proxies: list[Process], store: Store, seconds: float = 60) -> None:
    """Wait until every replica sees the store's budgets whole (no rebuild), has counted
    the replicas and holds bob's remainder: what local fail mode divides."""
    deadline = time.monotonic() + seconds
    while not all(whole(body := readiness(p)) and dividing(p) for p in proxies):
        if time.monotonic() > deadline:
            raise AssertionError((body, [dividing(p) for p in proxies], await dump(store)))
        await asyncio.sleep(0.2)


def dividing(proxy: Process) -> bool:
    """Whether the replica divides by 3 and holds a remainder (its metrics say)."""
    count = metric(proxy.url, "usage_proxy_limits_store_replicas")
    return count == 3 and metric(proxy.url, "usage_proxy_limits_store_remainders") >= 1


async def reranks(proxies: list[Process], count: int) -> list[int]:
    """``count`` of bob's reranks at once, spread evenly over the replicas: the statuses."""

    async def one(session: aiohttp.ClientSession, url: str) -> int:
        async with session.post(url + "/rerank", json=RERANK, headers=BOB) as resp:
            await resp.read()
            assert resp.status != 503 or resp.headers["retry-after"] != "0"
            return resp.status

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        return list(await asyncio.gather(*(one(session, proxies[i % 3].url) for i in range(count))))


def journaled(tmp: Path) -> list[int]:
    """Each record's billed total tokens, across the three journals."""
    return [
        (r.prompt_tokens_billed or 0) + (r.completion_tokens_billed or 0)
        for i in range(3)
        for r in journal_records(tmp / f"replica{i}/j.sqlite")
    ]


class Engine:
    """The fake engine's prompt counter, from the test's start: bob's work."""

    def __init__(self, fake: Process) -> None:
        self.fake = fake
        self.start = metric(fake.url)

    def work(self) -> float:
        return metric(self.fake.url) - self.start


async def outage(
    proxies: list[Process], store: Store, engine: Engine, admitted: int, count: int
) -> int:
    """The store killed, ``count`` reranks sent: the engine's work stays within the
    budget, and it is exactly the requests admitted; the requests admitted in all."""
    store.kill()
    statuses = await reranks(proxies, count)
    assert set(statuses) <= {200, 429, 503}, statuses
    admitted += statuses.count(200)
    assert engine.work() == 25 * admitted <= MONTH, statuses
    return admitted


async def back_empty(proxies: list[Process], store: Store, engine: Engine, admitted: int) -> int:
    """The store started again, empty, and rebuilt; 10 reranks more: within the budget."""
    store.start()
    await until_whole(proxies, store)
    statuses = await reranks(proxies, 10)
    assert set(statuses) <= {200, 429}, statuses
    admitted += statuses.count(200)
    assert engine.work() == 25 * admitted <= MONTH, statuses
    return admitted


def journals_equal_the_engine(tmp: Path, admitted: int) -> None:
    assert sorted(journaled(tmp)) == [25] * admitted


@pytest.mark.parametrize("counted", [False, True], ids=["at-start", "counted"])
async def test_the_store_dies_before_the_first_request_and_comes_back_empty(
    fake_upstream: Process, redis_store: Store, tmp_path: Path, counted: bool
) -> None:
    """Issue #52's first measurement: the store is killed before bob spends anything,
    right at the start (the replicas not counted yet: none assumes it is alone, each
    refuses) or once every replica has counted the others; 60 reranks in local mode
    admit at most the budget (before: 45 of 60, 1,125 tokens against 762: each replica
    divided by the count its first heartbeat saw, 1, 2 or 3), and once the store is back
    empty the month's engine work stays within it, the journals equal to it."""
    engine = Engine(fake_upstream)
    with local_replicas(fake_upstream, redis_store, tmp_path) as proxies:
        if counted:
            await until_whole(proxies, redis_store)
        admitted = await outage(proxies, redis_store, engine, 0, 60)
        if counted:  # each divides what was left, 762: 254 each, 10 reranks
            assert admitted == 30
        admitted = await back_empty(proxies, redis_store, engine, admitted)
    journals_equal_the_engine(tmp_path, admitted)


async def test_the_store_dies_half_spent_and_comes_back_empty(
    fake_upstream: Process, redis_store: Store, tmp_path: Path
) -> None:
    """Half the budget spent through the store (15 reranks, 375 tokens), then the store
    dies: the replicas divide the 387 left (5 reranks each), and the rebuilt store
    counts every record, the outage's included, before it admits: within the budget.
    (With --limits-replicas, whose count the rebuild waits for.)"""
    engine = Engine(fake_upstream)
    with local_replicas(fake_upstream, redis_store, tmp_path, "--limits-replicas", "3") as proxies:
        await until_whole(proxies, redis_store)
        statuses = await reranks(proxies, 15)
        assert statuses == [200] * 15
        await asyncio.sleep(6)  # a heartbeat (every 5 s) reads what is left after them
        admitted = await outage(proxies, redis_store, engine, 15, 60)
        assert admitted == 30
        admitted = await back_empty(proxies, redis_store, engine, admitted)
    journals_equal_the_engine(tmp_path, admitted)


async def test_a_second_outage_right_after_the_first(
    fake_upstream: Process, redis_store: Store, tmp_path: Path
) -> None:
    """The store dies, comes back empty and dies again a second later, before the
    replicas have counted each other anew: the second outage admits nothing more than
    the first left; after it, the rebuilt store holds both outages' records."""
    engine = Engine(fake_upstream)
    with local_replicas(fake_upstream, redis_store, tmp_path) as proxies:
        await until_whole(proxies, redis_store)
        admitted = await outage(proxies, redis_store, engine, 0, 30)
        redis_store.start()
        await asyncio.sleep(1)
        admitted = await outage(proxies, redis_store, engine, admitted, 60)
        admitted = await back_empty(proxies, redis_store, engine, admitted)
    journals_equal_the_engine(tmp_path, admitted)
