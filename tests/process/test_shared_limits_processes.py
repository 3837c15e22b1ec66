"""Issue #40's done-when with real processes: three ``usage-proxy serve`` processes (each
its own journal and store connections) in front of one fake vLLM process share one tenant
budget on a real redis-server. 300 concurrent requests spread over them: the engine's own
prompt counter grows by no more than the budget (zero overshoot), and the three journals
add up to the store's charge. (tests/app/test_shared_limits.py holds the outage cases with
three apps in one process.)"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp
import yaml
from redis.asyncio import Redis

from scripts.vllm_cpu import Process, metric, start_proxy
from tests.support.records import journal_records
from tests.support.redisserver import Store

ACME = {"X-Tenant-Id": "acme"}
EMBED = {"input": "hi"}  # 3 prompt tokens with MiniLM
BUDGET = 450  # 150 requests


def readiness(proxy: Process) -> dict[str, object]:
    """The replica's /readyz body (503 included)."""
    try:
        with urllib.request.urlopen(proxy.url + "/readyz", timeout=5) as resp:
            return dict(json.loads(resp.read()))
    except urllib.error.HTTPError as exc:
        return dict(json.loads(exc.read()))


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


async def test_three_proxy_processes_share_one_budget(
    fake_upstream: Process, redis_store: Store, tmp_path: Path
) -> None:
    """Zero overshoot at the engine, every admitted request journaled once, the store's
    charge equal to the journals' sum, over three processes."""
    limits = tmp_path / "limits.yaml"
    limits.write_text(yaml.safe_dump({"tenants": {"acme": {"prompt_tokens_per_day": BUDGET}}}))
    proxies: list[Process] = []
    try:
        for i in range(3):
            work = tmp_path / f"replica{i}"
            work.mkdir()
            proxies.append(
                start_proxy(
                    fake_upstream.url,
                    work,
                    *("--journal", str(work / "j.sqlite"), "--instance", f"replica{i}"),
                    *("--tenant-header", "X-Tenant-Id", "--limits", str(limits)),
                    *("--limits-store", redis_store.url, "--limits-replicas", "3"),
                    # a store answer late on this loaded 2-core box is a 503, never a pass
                    *("--limits-fail-mode", "closed", "--limits-store-timeout", "2"),
                )
            )
        for proxy in proxies:
            proxy.wait_ready("/readyz", 60)
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
    finally:
        for proxy in proxies:
            proxy.stop()  # SIGTERM: a graceful stop flushes the journal
    journaled = [r for i in range(3) for r in journal_records(tmp_path / f"replica{i}/j.sqlite")]
    assert len(journaled) == admitted
    assert sum(r.prompt_tokens_billed or 0 for r in journaled) == engine
    assert await charged(redis_store) == engine
