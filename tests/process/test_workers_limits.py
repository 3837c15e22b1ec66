"""The limits of ``usage-proxy serve --workers 2`` as real processes (issue #61, "Done
when"), without a store (the supervisor hosts the pod's limiter) and with a real
redis-server (each worker a replica): a burst over many connections has zero overshoot,
a monthly budget is spendable to the end through either worker and no further, and a
restart keeps the month. (tests/app/test_pod_limits.py has the same in one process.)"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import aiohttp
import pytest
import yaml
from redis.asyncio import Redis

from scripts.vllm_cpu import Process, free_port, metric, start_proxy
from tests.support.processes import readiness, shard_records, start_fake, workers_of
from tests.support.redisserver import Store

ACME = {"X-Tenant-Id": "acme"}
HI = {"model": "minilm", "input": "hi"}  # 3 prompt tokens with MiniLM
POD = ("--workers", "2", "--reconcile-interval", "0", "--tenant-header", "X-Tenant-Id")
# a store answer late on this loaded 2-core box is a 503, never a pass
STORED = ("--limits-replicas", "1", "--limits-fail-mode", "closed", "--limits-store-timeout", "2")


@pytest.fixture(params=["none", "redis"])
def store(request: pytest.FixtureRequest) -> Store | None:
    """No store (the pod's limiter host), or a fresh redis-server."""
    if request.param == "none":
        return None
    found: Store = request.getfixturevalue("redis_store")
    return found


def start_pod(
    fake: Process, tmp: Path, tenant: dict[str, object], store: Store | None, port: int
) -> Process:
    """``serve --workers 2`` under ``tenant``'s limits, ready, both workers reporting
    no problem (with a store: its budgets whole)."""
    limits = tmp / "limits.yaml"
    limits.write_text(yaml.safe_dump({"tenants": {"acme": tenant}}))
    shared = ("--limits-store", store.url, *STORED) if store is not None else ()
    journal = ("--journal", str(tmp / "j.sqlite"), "--limits", str(limits))
    proxy = start_proxy(fake.url, tmp, *POD, *journal, *shared, port=port)
    proxy.wait_ready("/readyz", 60)
    deadline, quiet = time.monotonic() + 30, 0
    while quiet < 8:  # new connections: either worker answers
        body = readiness(proxy)
        quiet = quiet + 1 if body["status"] == "ready" and not body["problems"] else 0
        if time.monotonic() > deadline:
            raise AssertionError((body, proxy.tail()))
        time.sleep(0.05)
    return proxy


async def embed(session: aiohttp.ClientSession, url: str, tenant: str = "acme") -> int:
    headers = {"X-Tenant-Id": tenant}
    async with session.post(url + "/v1/embeddings", json=HI, headers=headers) as resp:
        await resp.read()
        return resp.status


def fresh() -> aiohttp.ClientSession:
    """A new connection per request (the kernel spreads them over the workers)."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True, limit=0))


async def one_by_one(url: str, count: int) -> list[int]:
    async with fresh() as session:
        return [await embed(session, url) for _ in range(count)]


async def forget(store: Store) -> None:
    """The store loses every key (as a restarted store without persistence)."""
    client = Redis.from_url(store.url)
    try:
        await client.flushall()
    finally:
        await client.aclose()


def records_per_shard(tmp: Path, tenant: str = "acme") -> list[int]:
    held = shard_records(tmp / "j.sqlite").values()
    return [sum(r.tenant == tenant for r in records) for records in held]


async def test_a_burst_has_zero_overshoot(
    fake_upstream: Process, tmp_path: Path, store: Store | None
) -> None:
    """100 simultaneous requests over 100 new connections against 40 a minute: exactly
    40 answered, 60 refused with 429, the engine did 40 requests' work and the shards
    hold 40 records. The same pattern just before (an unlimited tenant's 20 requests)
    went through both workers: both shards hold its records. (Which worker's burst
    reaches the host first is a race: the 40 admitted were split 27/13, 1/39 and 21/19
    in three runs, so the split is not asserted.)"""
    proxy = start_pod(fake_upstream, tmp_path, {"requests_per_minute": 40}, store, free_port())
    try:
        async with fresh() as session:
            warm = await asyncio.gather(*(embed(session, proxy.url, "warm") for _ in range(20)))
        assert warm == [200] * 20
        before = metric(fake_upstream.url)
        async with fresh() as session:
            statuses = await asyncio.gather(*(embed(session, proxy.url) for _ in range(100)))
        engine = metric(fake_upstream.url) - before
    finally:
        proxy.stop()
    assert proxy.popen.returncode == 0, proxy.tail()
    assert (statuses.count(200), statuses.count(429)) == (40, 60), statuses
    assert engine == 40 * 3
    warmed = records_per_shard(tmp_path, "warm")
    assert len(warmed) == 2, warmed
    assert all(warmed), warmed  # fresh connections reach both workers
    assert sum(records_per_shard(tmp_path)) == 40


async def test_a_monthly_budget_is_spent_to_the_end_through_either_worker(
    fake_upstream: Process, tmp_path: Path, store: Store | None
) -> None:
    """A budget of 30 requests' prompt tokens: 25 on new connections (both workers
    serve), the last 5 through one keep-alive connection (one worker: the whole
    remainder is usable there), then the next is refused on that connection and on new
    ones; the engine did exactly the budget's work."""
    budget = 30 * 3
    tenant = {"prompt_tokens_per_month": budget}
    proxy = start_pod(fake_upstream, tmp_path, tenant, store, free_port())
    try:
        before = metric(fake_upstream.url)
        spread = await one_by_one(proxy.url, 25)
        kept = aiohttp.TCPConnector(limit=1)
        async with aiohttp.ClientSession(connector=kept) as one:
            last = [await embed(one, proxy.url) for _ in range(6)]
        beyond = await one_by_one(proxy.url, 6)
        engine = metric(fake_upstream.url) - before
    finally:
        proxy.stop()
    assert proxy.popen.returncode == 0, proxy.tail()
    assert spread == [200] * 25
    assert last == [200] * 5 + [429]
    assert beyond == [429] * 6
    assert engine == budget
    shards = records_per_shard(tmp_path)
    assert len(shards) == 2, shards
    assert sum(shards) == 30


async def test_a_restart_keeps_the_month(
    fake_upstream: Process, tmp_path: Path, store: Store | None
) -> None:
    """20 of 30 requests' budget spent, the pod stopped (SIGTERM: drained) and started
    again with two workers: exactly 10 more are admitted. With a store, the store lost
    everything meanwhile: it is rebuilt from both workers' journals, each worker a
    replica of its own (two sharing one replica id would count one shard)."""
    tenant = {"prompt_tokens_per_month": 30 * 3}
    port = free_port()
    proxy = start_pod(fake_upstream, tmp_path, tenant, store, port)
    try:
        first = await one_by_one(proxy.url, 20)
    finally:
        proxy.stop()
    assert proxy.popen.returncode == 0, proxy.tail()
    assert first == [200] * 20
    if store is not None:
        await forget(store)
    proxy = start_pod(fake_upstream, tmp_path, tenant, store, port)
    try:
        second = await one_by_one(proxy.url, 12)
    finally:
        proxy.stop()
    assert proxy.popen.returncode == 0, proxy.tail()
    assert second == [200] * 10 + [429] * 2
    assert sum(records_per_shard(tmp_path)) == 30


async def test_a_changed_limits_file_and_sighup_reach_every_worker_and_the_host(
    fake_upstream: Process, tmp_path: Path, store: Store | None
) -> None:
    """The limits file raised from 10 to 20 a minute and SIGHUP sent to the supervisor:
    once every worker has loaded it (the pod's oldest load, a livemin gauge, is after
    the signal), a burst of 30 over new connections admits exactly 20: the workers and
    the host (or the store) use the new amount."""
    proxy = start_pod(fake_upstream, tmp_path, {"requests_per_minute": 10}, store, free_port())
    try:
        limits = tmp_path / "limits.yaml"
        limits.write_text(yaml.safe_dump({"tenants": {"acme": {"requests_per_minute": 20}}}))
        signalled = time.time()
        os.kill(proxy.popen.pid, signal.SIGHUP)
        loaded = "usage_proxy_limits_loaded_timestamp_seconds"
        deadline = time.monotonic() + 20
        while metric(proxy.url, loaded) < signalled:
            assert time.monotonic() < deadline, proxy.tail()
            await asyncio.sleep(0.1)
        async with fresh() as session:
            statuses = await asyncio.gather(*(embed(session, proxy.url) for _ in range(30)))
    finally:
        proxy.stop()
    assert proxy.popen.returncode == 0, proxy.tail()
    assert (statuses.count(200), statuses.count(429)) == (20, 10), statuses


RERANK = {"model": "minilm", "query": "a question", "documents": ["one", "two words"]}


async def rerank(session: aiohttp.ClientSession, url: str, tenant: str = "acme") -> int:
    headers = {"X-Tenant-Id": tenant}
    async with session.post(url + "/rerank", json=RERANK, headers=headers) as resp:
        await resp.read()
        return resp.status


async def test_a_worker_killed_mid_load_leaves_the_month_exact(
    minilm_path: Path, tmp_path: Path
) -> None:
    """The pod's limiter host (no store), a budget of 60 reranks' prompt tokens, 16
    clients on new connections, the engine answering each rerank 0.3 s late: a worker is
    SIGKILLed once 20 were answered, with its reservations in flight and no record for
    them. The supervisor reads its shard again before restarting it, so what its lost
    connection held is counted once, from its records: spending to the end, the shards
    hold exactly the budget's 60 records (no overshoot, nothing stranded). Without that
    re-read (supervisor.worker_exited) the dead worker's held units stay taken for the
    month and fewer than 60 are ever admitted."""
    slow = start_fake(minilm_path, tmp_path, delay=0.3)
    before = metric(slow.url)
    async with fresh() as session, session.post(slow.url + "/rerank", json=RERANK) as resp:
        assert resp.status == 200  # what one rerank costs, on the engine alone
    each = int(metric(slow.url) - before)
    assert each > 0
    proxy = start_pod(slow, tmp_path, {"prompt_tokens_per_month": 60 * each}, None, 0)
    answered, killed = 0, asyncio.Event()

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal answered
        while not killed.is_set():
            with contextlib.suppress(aiohttp.ClientError):
                if await rerank(session, proxy.url) == 200:
                    answered += 1

    try:
        victim = workers_of(proxy)[0]
        async with fresh() as session:
            clients = [asyncio.create_task(client(session)) for _ in range(16)]
            deadline = time.monotonic() + 60
            while answered < 20:
                assert time.monotonic() < deadline, proxy.tail()
                await asyncio.sleep(0.005)
            os.kill(victim, signal.SIGKILL)
            killed.set()
            await asyncio.gather(*clients)
        deadline = time.monotonic() + 60
        while victim in workers_of(proxy) or len(workers_of(proxy)) < 2:
            assert time.monotonic() < deadline, proxy.tail()
            await asyncio.sleep(0.1)
        proxy.wait_ready("/readyz", 60)
        statuses: list[int] = []
        while statuses[-3:] != [429] * 3:  # spend to the end, on new connections
            assert len(statuses) < 100, (statuses, proxy.tail())
            async with fresh() as session:
                with contextlib.suppress(aiohttp.ClientError):
                    statuses.append(await rerank(session, proxy.url))
    finally:
        proxy.stop()
        slow.stop()
    assert proxy.popen.returncode == 0, proxy.tail()
    assert 503 not in statuses, statuses
    assert sum(records_per_shard(tmp_path)) == 60


async def test_a_limits_file_of_2000_tenants_serves_through_both_workers(
    fake_upstream: Process, tmp_path: Path
) -> None:
    """Review finding 1: a limits file of 2,000 tenants (about 2 MB as the policies'
    one line, far over asyncio's 64 KiB default) leaves no worker cut off from the
    pod's limiter host: the pod gets ready, both workers report no problem, and a burst
    over new connections is limited exactly (5 of 12 admitted, the rest 429, no 503)."""
    tenants: dict[str, object] = {
        f"tenant-{k:04}": {"prompt_tokens_per_month": 1000 + k, "requests_per_minute": 2}
        for k in range(2000)
    }
    tenants["acme"] = {"requests_per_minute": 5}
    limits = tmp_path / "limits.yaml"
    limits.write_text(yaml.safe_dump({"tenants": tenants}))
    journal = ("--journal", str(tmp_path / "j.sqlite"), "--limits", str(limits))
    proxy = start_proxy(fake_upstream.url, tmp_path, *POD, *journal, port=free_port())
    try:
        proxy.wait_ready("/readyz", 60)
        bodies = [readiness(proxy) for _ in range(8)]
        async with fresh() as session:
            statuses = await asyncio.gather(*(embed(session, proxy.url) for _ in range(12)))
    finally:
        proxy.stop()
    assert proxy.popen.returncode == 0, proxy.tail()
    assert all(b["status"] == "ready" and not b["problems"] for b in bodies), bodies
    assert (statuses.count(200), statuses.count(429)) == (5, 7), statuses
