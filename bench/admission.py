"""What admission (``--limits``) adds per request, in one process and one run, side by
side with no limits: the embedded limiter alone (reserve + settle over three levels), and
a rerank through the whole proxy in front of the fake vLLM (same event loop), with no
limits, with a request rate only, and with a token budget, each for texts the count cache
holds and for fresh texts (whose count is then awaited before forwarding). Where a
redis-server (or valkey-server) binary exists, the same token budget on a loopback store
(``--limits-store``, issue #40) beside them: the shared limiter alone (two round trips:
reserve, settle) and through the proxy.

Run alone: ``.venv/bin/python -m bench.admission [requests]``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar, cast

from bench.harness import minilm_dir

T = TypeVar("T")
STORE_ROW = "token budget, loopback redis-server store"
LIMITS = {
    "none": None,
    "requests only": {"tenants": {"acme": {"requests_per_second": 1_000_000}}},
    "token budget": {
        "tenants": {
            "acme": {
                "prompt_tokens_per_day": 10**12,
                "requests_per_second": 1_000_000,
                "models": {"minilm": {"prompt_tokens_per_minute": 10**12}},
            }
        }
    },
}


BENCH_POLICIES = {
    "tenants": {
        "acme": {
            "requests_per_minute": 10**9,
            "total_tokens_per_month": 10**15,
            "concurrency": 10**6,
            "models": {"m": {"prompt_tokens_per_minute": 10**12}},
            "keys": {"abcdefabcdef": {"requests_per_second": 10**9}},
        }
    }
}


def limiter_cost(repeat: int) -> float:
    """Microseconds of CPU for one reserve + settle at three levels (tenant, model, key)."""
    from proxy.limits.limiter import Cost, Who
    from proxy.limits.policy import Policies
    from proxy.limitstore.memory import InProcessLimiter

    policies = Policies.model_validate(BENCH_POLICIES)
    limiter = InProcessLimiter(policies)
    who, now = Who("acme", "m", "abcdefabcdef"), time.time()

    def done(step: Coroutine[Any, Any, T]) -> T:
        """The in-process limiter never suspends: its coroutines end on their first step."""
        try:
            step.send(None)
        except StopIteration as end:
            return cast(T, end.value)
        raise AssertionError("the in-process limiter suspended")

    def once() -> None:
        ticket = done(limiter.reserve(who, Cost(40, 10), now)).ticket
        assert ticket is not None
        done(limiter.settle(ticket, Cost(30, 10), now))

    once()
    started = time.process_time()
    for _ in range(repeat):
        once()
    return (time.process_time() - started) / repeat * 1e6


async def _store_pairs(url: str, repeat: int) -> dict[str, float]:
    """Wall and CPU µs per reserve + settle at three levels on the store at ``url``."""
    from redis.asyncio import Redis

    from proxy.limits.limiter import Cost, Who
    from proxy.limits.policy import Policies
    from proxy.limitstore.redislimiter import RedisLimiter

    client = Redis.from_url(url)
    limiter = RedisLimiter(Policies.model_validate(BENCH_POLICIES), client, grace=0.0)
    who, now = Who("acme", "m", "abcdefabcdef"), time.time()
    assert (await limiter.sync(1, now)).complete

    async def once() -> None:
        ticket = (await limiter.reserve(who, Cost(40, 10), now)).ticket
        assert ticket is not None
        await limiter.settle(ticket, Cost(30, 10), now)

    for _ in range(20):
        await once()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(repeat):
        await once()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    await client.aclose()
    return {"store_limiter_us": wall / repeat * 1e6, "store_limiter_cpu_us": cpu / repeat * 1e6}


class _LoopbackStore:
    """A throwaway redis-server on loopback (tests.support.redisserver), or none."""

    def __enter__(self) -> str | None:
        from scripts.vllm_cpu import free_port
        from tests.support.redisserver import Store, server_binary

        binary = server_binary()
        self._tmp = tempfile.TemporaryDirectory()
        self.store = None if binary is None else Store(binary, Path(self._tmp.name), free_port())
        if self.store is None:
            return None
        self.store.start()
        return self.store.url

    def __exit__(self, *exc: object) -> None:
        if self.store is not None:
            self.store.kill()
        self._tmp.cleanup()


async def _through_proxy(
    limits: dict[str, Any] | None, fresh: bool, requests: int, store: str | None = None
) -> float:
    """CPU ms per sequential rerank (the proxy and the fake share the process); with
    ``store``, the limits on that Redis/Valkey store."""
    import yaml
    from aiohttp.test_utils import TestClient, TestServer

    from tests.support.proxies import fake_and_proxy

    async def server(app: Any) -> TestServer:
        s = TestServer(app)
        await s.start_server()
        return s

    async def client(app: Any) -> TestClient[Any, Any]:
        c: TestClient[Any, Any] = TestClient(TestServer(app))
        await c.start_server()
        return c

    with tempfile.TemporaryDirectory() as tmp:
        options: dict[str, Any] = {"journal": str(Path(tmp) / "j.sqlite")}
        if limits is not None:
            path = Path(tmp) / "limits.yaml"
            path.write_text(yaml.safe_dump(limits))
            options["limits"] = str(path)
        if store is not None:  # a timeout long enough that no admission falls back
            options.update(limits_store=store, limits_replicas=1, limits_store_timeout=1.0)
        _, proxy = await fake_and_proxy(
            server, client, minilm_dir(), tenant_header="X-Tenant-Id", **options
        )
        docs = [f"document number {i} about the capital of France" for i in range(8)]

        async def one(i: int) -> None:
            query = f"fresh query {i} {time.perf_counter_ns()}" if fresh else "what is it?"
            resp = await proxy.post(
                "/rerank",
                json={"query": query, "documents": docs},
                headers={"X-Tenant-Id": "acme"},
            )
            assert resp.status == 200, await resp.text()
            await resp.read()

        for i in range(5):
            await one(i)
        started = time.process_time()
        for i in range(requests):
            await one(i)
        cpu = (time.process_time() - started) / requests * 1000
        if store is not None:  # every admission was the store's, none the fail mode's
            from proxy.limitstore.guard import GuardedLimiter
            from proxy.serving.admission import ADMISSION

            guarded = proxy.app[ADMISSION].limiter
            assert isinstance(guarded, GuardedLimiter)
            fails = guarded.mode.fail_admissions
            assert not any(fails.values()), fails
        await proxy.close()
        return cpu


def admission_cost(requests: int) -> dict[str, float]:
    """{"limiter_us": ..., "<limits>, <hit|fresh>_ms": CPU ms per request}."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = {"limiter_us": limiter_cost(2000)}
    for name, limits in LIMITS.items():
        for fresh in (False, True):
            key = f"{name}, {'fresh texts' if fresh else 'cache hit'}"
            out[key] = asyncio.run(_through_proxy(limits, fresh, requests))
    with _LoopbackStore() as url:
        if url is not None:
            out |= asyncio.run(_store_pairs(url, max(requests, 200)))
            for fresh in (False, True):
                key = f"{STORE_ROW}, {'fresh texts' if fresh else 'cache hit'}"
                budget = LIMITS["token budget"]
                out[key] = asyncio.run(_through_proxy(budget, fresh, requests, url))
    return out


def render(a: dict[str, float]) -> list[str]:
    """The section of docs/performance.md's generated block."""
    lines = [
        "## What admission adds (--limits, in-process, CPU ms per sequential rerank 1x8)",
        "",
        f"- the embedded limiter alone, reserve + settle over three levels: "
        f"{a['limiter_us']:.1f} µs",
        "",
    ]
    if "store_limiter_us" in a:
        lines.append(
            f"- the shared limiter alone on a loopback redis-server, reserve + settle (two "
            f"round trips) over the same three levels: {a['store_limiter_us']:.0f} µs wall, "
            f"{a['store_limiter_cpu_us']:.0f} µs CPU in the proxy's process"
        )
    lines += ["", "| limits | cache hit | fresh texts |", "|---|---:|---:|"]
    base_hit, base_fresh = a["none, cache hit"], a["none, fresh texts"]
    for name in [*LIMITS, *([STORE_ROW] if f"{STORE_ROW}, cache hit" in a else [])]:
        hit, fresh = a[f"{name}, cache hit"], a[f"{name}, fresh texts"]
        if name == "none":
            lines.append(f"| none | {hit:.3f} | {fresh:.3f} |")
        else:
            lines.append(
                f"| {name} | {hit:.3f} ({hit - base_hit:+.3f}) | "
                f"{fresh:.3f} ({fresh - base_fresh:+.3f}) |"
            )
    return lines


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    print("\n".join(render(admission_cost(int(sys.argv[1]) if len(sys.argv) > 1 else 200))))
