"""``usage-proxy serve --workers 2`` as its own processes (docs/workers.md, "The tests of
Done when"): one port served by both workers, each journaling to its own shard, one
``/metrics`` summing both; a worker killed under load comes back; workers that keep dying
end the pod; a start-up mistake is said once."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from scripts.vllm_cpu import Process, free_port, metric, start_proxy
from tests.support.processes import shard_records, workers_of

POD = ("--workers", "2", "--reconcile-interval", "0")


def start_pod(upstream: str, workdir: Path, *args: str, port: int | None = None) -> Process:
    """``serve --workers 2`` journalling to ``workdir/j.sqlite``, ready."""
    journal = ("--journal", str(workdir / "j.sqlite"))
    proxy = start_proxy(upstream, workdir, *POD, *journal, *args, port=port or free_port())
    proxy.wait_ready("/readyz", 60)
    return proxy


async def embed(session: aiohttp.ClientSession, url: str, text: str) -> int:
    """One embedding of ``text``; its status."""
    body = {"model": "minilm", "input": text}
    async with session.post(url + "/v1/embeddings", json=body) as resp:
        await resp.read()
        return resp.status


async def spread(url: str, count: int, connections: int) -> list[int]:
    """``count`` embeddings at once: half over a pool of ``connections`` keep-alive
    connections, half each on a connection of its own."""
    texts = [f"request number {i} of the spread" for i in range(count)]
    pooled = aiohttp.TCPConnector(limit=connections)
    async with (
        aiohttp.ClientSession(connector=pooled) as kept,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as fresh,
    ):
        sends = [embed(kept if i % 2 else fresh, url, t) for i, t in enumerate(texts)]
        return list(await asyncio.gather(*sends))


def families(url: str) -> dict[str, float]:
    """Every sample of the page (fetched on a new connection: the kernel may hand it to
    either worker), summed by name."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        page = resp.read().decode()
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    return sums


async def test_two_workers_serve_one_port(fake_upstream: Process, tmp_path: Path) -> None:
    """300 concurrent requests over many connections: both workers served (both shards
    hold records), the records equal the fake engine's work exactly, their ids are
    distinct, and every scrape of /metrics, whichever worker answers, sums both."""
    before = metric(fake_upstream.url)
    proxy = start_pod(fake_upstream.url, tmp_path)
    try:
        assert len(workers_of(proxy)) == 2
        statuses = await spread(proxy.url, 300, connections=64)
        assert statuses == [200] * 300
        engine = metric(fake_upstream.url) - before
        pages = [families(proxy.url) for _ in range(10)]
    finally:
        proxy.stop()
    assert proxy.popen.returncode == 0, proxy.tail()
    held = shard_records(tmp_path / "j.sqlite")
    sizes = {p.name: len(r) for p, r in held.items()}
    assert len(held) == 2, sizes
    assert all(held.values()), sizes
    records = [r for shard in held.values() for r in shard]
    assert len(records) == 300
    assert len({r.record_id for r in records}) == 300
    assert sum(r.prompt_tokens_billed or 0 for r in records) == engine
    name = "usage_proxy_billed_prompt_tokens_total"
    assert {page.get(name) for page in pages} == {engine}, [p.get(name) for p in pages]
    assert {page.get("usage_proxy_workers_ready") for page in pages} == {2.0}
