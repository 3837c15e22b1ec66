"""The pod's reconciler (``serve --workers 2``, docs/workers.md "Reconciliation"): one
chain of windows for the whole pod, journaled by worker 0, each closed only when no
worker has an exchange in flight, its billed tokens matching the engine's growth."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp

from proxy.ledger.shards import shard_path
from proxy.ledger.windows import SettledWindow
from scripts.vllm_cpu import Process, free_port, metric, start_proxy
from tests.support.processes import metric_sums, shard_records, shard_windows, start_fake

INTERVAL = "0.5"


def start_pod(upstream: str, workdir: Path) -> Process:
    """``serve --workers 2`` reconciling every half second, ready."""
    journal = ("--journal", str(workdir / "j.sqlite"))
    argv = ("--workers", "2", "--reconcile-interval", INTERVAL, *journal)
    proxy = start_proxy(upstream, workdir, *argv, port=free_port())
    proxy.wait_ready("/readyz", 60)
    return proxy


def windows(workdir: Path) -> list[SettledWindow]:
    """Every window the pod journaled, in every shard, oldest first."""
    held = shard_windows(workdir / "j.sqlite")
    return sorted((w for shard in held.values() for w in shard), key=lambda w: w.end)


async def until(found: Callable[[], bool], seconds: float = 30) -> None:
    """Wait for ``found()`` (polled), failing after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not found():
        assert time.monotonic() < deadline, "not found in time"
        await asyncio.sleep(0.1)


async def embeddings(url: str, count: int) -> list[int]:
    """``count`` embeddings at once, each on a connection of its own (so both workers
    serve some); their statuses."""
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(i: int) -> int:
            body = {"model": "minilm", "input": f"reconciled request {i} of the pod"}
            async with session.post(url + "/v1/embeddings", json=body) as resp:
                await resp.read()
                return resp.status

        return list(await asyncio.gather(*(one(i) for i in range(count))))


async def test_a_pod_journals_one_chain_of_windows_that_matches_the_engine(
    fake_upstream: Process, tmp_path: Path
) -> None:
    """Traffic through both workers, then quiet: the windows are worker 0's alone (one
    chain, each starting where the last ended: not a window per worker, which would each
    claim the whole engine against half the records), they hold every record once, and
    their billed tokens equal the engine's growth with no drift. The pod's page says so."""
    proxy = start_pod(fake_upstream.url, tmp_path)
    try:
        await until(lambda: bool(windows(tmp_path)))  # the reconciler has its baseline
        before = metric(fake_upstream.url)
        assert await embeddings(proxy.url, 60) == [200] * 60
        engine = metric(fake_upstream.url) - before
        await until(lambda: sum(w.records for w in windows(tmp_path)) == 60)
        figures = metric_sums(proxy.url)
    finally:
        proxy.stop()
    assert proxy.popen.returncode == 0, proxy.tail()
    held = shard_windows(tmp_path / "j.sqlite")
    journal = tmp_path / "j.sqlite"
    assert held[shard_path(journal, 1)] == [], "only worker 0 journals windows"
    chain = windows(tmp_path)
    assert all(a.end == b.start for a, b in itertools.pairwise(chain))
    assert all(w.status == "settled" for w in chain)
    assert sum(w.billed_prompt_tokens for w in chain) == engine > 0
    assert sum(w.engine_prompt_tokens or 0 for w in chain) == engine
    assert all(w.unbilled_prompt_tokens == w.overbilled_prompt_tokens == 0 for w in chain)
    records = shard_records(journal)
    assert all(records.values()), "both workers served"
    assert figures["usage_proxy_engine_prompt_tokens_total"] == engine
    assert figures["usage_proxy_reconcile_interval_seconds"] == float(INTERVAL)
    last = figures["usage_proxy_reconcile_last_settled_timestamp_seconds"]
    assert last >= max(w.end for w in chain if w.records).timestamp() - 1e-3


async def test_an_exchange_in_flight_in_either_worker_keeps_the_window_open(
    minilm_path: Path, tmp_path: Path
) -> None:
    """A rerank the engine takes 3 s to answer: while it is in flight no window closes
    (every worker must be quiet, not just the one asked first), and the window that closes
    after it holds its record, matched."""
    slow = start_fake(minilm_path, tmp_path, delay=3.0)
    proxy = start_pod(slow.url, tmp_path)
    try:
        await until(lambda: bool(windows(tmp_path)))
        sent = datetime.now(UTC)
        body = {"model": "minilm", "query": "a question", "documents": ["one", "two words"]}
        async with (
            aiohttp.ClientSession() as session,
            session.post(proxy.url + "/rerank", json=body) as resp,
        ):
            assert resp.status == 200, await resp.text()
        answered = datetime.now(UTC)
        await until(lambda: any(w.records for w in windows(tmp_path)))
    finally:
        proxy.stop()
        slow.stop()
    assert proxy.popen.returncode == 0, proxy.tail()
    margin = timedelta(seconds=0.5)
    chain = windows(tmp_path)
    closed_meanwhile = [w.end for w in chain if sent + margin < w.end < answered - margin]
    assert closed_meanwhile == []
    (window,) = [w for w in chain if w.records]
    assert window.records == 1
    assert window.start < sent + margin
    assert window.end > answered - margin
    assert window.status == "settled"
    assert window.billed_prompt_tokens == window.engine_prompt_tokens
