"""``usage-proxy serve --workers 2`` as its own processes (docs/workers.md, "The tests of
Done when"): one port served by both workers, each journaling to its own shard, one
``/metrics`` summing both; a worker killed under load comes back; workers that keep dying
end the pod; a start-up mistake is said once."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from proxy.serving.tenancy import key_digest
from scripts.vllm_cpu import Process, free_port, metric, start_proxy
from tests.support.postgres import Cluster, fresh_database
from tests.support.processes import (
    in_ledger,
    metric_sums,
    shard_records,
    start_ledgered_proxy,
    status_with_key,
    workers_of,
)

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
        pages = [metric_sums(proxy.url) for _ in range(10)]
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


async def answered(session: aiohttp.ClientSession, url: str, text: str, ids: list[str]) -> None:
    """One embedding, sent again after a connection error (a client of a pod retries
    them: a worker that dies resets its connections) until it is answered; the record
    id of a 200 joins ``ids``."""
    body = {"model": "minilm", "input": text}
    for _ in range(50):
        try:
            async with session.post(url + "/v1/embeddings", json=body) as resp:
                await resp.read()
                assert resp.status == 200, resp.status
                ids.append(resp.headers["x-usage-record-id"])
                return
        except aiohttp.ClientConnectionError:
            await asyncio.sleep(0.05)
    raise AssertionError(f"{text!r} was never answered")


async def load(url: str, count: int, connections: int, ids: list[str]) -> None:
    """``count`` embeddings, ``connections`` at a time over keep-alive connections."""
    queue = [f"load {i}: the quick brown fox" for i in range(count)]

    async def client(session: aiohttp.ClientSession) -> None:
        while queue:
            await answered(session, url, queue.pop(), ids)

    connector = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(client(session) for _ in range(connections)))


def readyz(url: str) -> tuple[int, dict[str, Any]]:
    """The pod's readiness, on a new connection."""
    try:
        with urllib.request.urlopen(url + "/readyz", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def test_a_worker_killed_under_load_comes_back(
    postgres: Cluster, fake_upstream: Process, tmp_path: Path
) -> None:
    """SIGKILL one worker of two under load (PostgreSQL ledger): the port keeps
    answering, the worker comes back (restarts counter 1, /readyz 200 with 2 ready
    workers), and after delivery every acknowledged record is in the ledger exactly
    once."""
    dsn = await fresh_database(postgres)
    proxy = start_ledgered_proxy(fake_upstream.url, tmp_path, dsn, *POD)
    try:
        ids: list[str] = []
        running = asyncio.create_task(load(proxy.url, 600, 32, ids))
        while len(ids) < 150:
            await asyncio.sleep(0.01)
        victim = workers_of(proxy)[-1]
        os.kill(victim, signal.SIGKILL)
        await running
        assert len(ids) == 600
        deadline = time.monotonic() + 30
        while readyz(proxy.url)[0] != 200 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        status, body = readyz(proxy.url)
        assert status == 200, body
        assert body["workers"] == {"0": "ready", "1": "ready"}
        assert victim not in workers_of(proxy)
        assert len(workers_of(proxy)) == 2
        assert metric_sums(proxy.url)["usage_proxy_worker_restarts_total"] == 1
        ledger, total, distinct = await in_ledger(dsn, ids)
    finally:
        proxy.stop()
    assert [i for i in ids if i not in ledger] == []
    assert total == distinct
    assert len(set(ids)) == len(ids)


async def test_workers_keep_dying_then_the_pod_exits(
    fake_upstream: Process, tmp_path: Path
) -> None:
    """One worker SIGKILLed each time it comes back, 5 times: the supervisor drains the
    other and exits 1 within the back-off (0.5 + 1 + 2 + 4 s) and the starts, saying
    why; the port is closed afterwards."""
    proxy = start_pod(fake_upstream.url, tmp_path)
    survivor, victim = workers_of(proxy)
    started = time.monotonic()
    killed = 0
    try:
        while killed < 5 and time.monotonic() - started < 60:
            os.kill(victim, signal.SIGKILL)
            killed += 1
            while proxy.popen.poll() is None and time.monotonic() - started < 60:
                others = [p for p in workers_of(proxy) if p not in (survivor, victim)]
                if others:
                    victim = others[0]
                    break
                await asyncio.sleep(0.02)
        code = proxy.popen.wait(60)
    finally:
        proxy.stop()
    assert killed == 5
    assert code == 1, proxy.tail()
    assert time.monotonic() - started < 40
    assert "workers_keep_dying" in proxy.log.read_text()
    with (
        pytest.raises(ConnectionRefusedError),
        socket.create_connection(("127.0.0.1", port_of(proxy)), 2),
    ):
        pass


def port_of(proxy: Process) -> int:
    return int(proxy.url.rsplit(":", 1)[1])


async def test_a_start_up_mistake_is_said_once(fake_upstream: Process, tmp_path: Path) -> None:
    """--workers 2 on a port already taken: exit 2, the one line of the port probe,
    once, and no worker started."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proxy = start_proxy(fake_upstream.url, tmp_path, *POD, port=port)
        code = proxy.popen.wait(60)
    said = proxy.log.read_text()
    assert code == 2, said
    assert said.count("address already in use") == 1, said
    assert "worker_started" not in said


async def test_a_workers_start_up_mistake_ends_the_pod(
    fake_upstream: Process, tmp_path: Path
) -> None:
    """A mistake only a worker finds (a price file that is not there): it exits 2, the
    supervisor restarts nothing, drains the other worker and exits 2; the line names the
    flag."""
    prices = tmp_path / "missing" / "prices.yaml"
    proxy = start_proxy(fake_upstream.url, tmp_path, *POD, "--prices", str(prices))
    try:
        code = proxy.popen.wait(60)
    finally:
        proxy.stop()
    said = proxy.log.read_text()
    assert code == 2, said
    assert f"cannot read --prices {prices}" in said
    assert "worker_restarting" not in said


async def test_a_smaller_pod_delivers_the_shards_it_no_longer_writes(
    fake_upstream: Process, tmp_path: Path
) -> None:
    """A pod of 3 workers journals without an exporter; the same journal then serves 2
    workers with a JSON-lines exporter: worker 0 adopts shard 2 (2 mod 2), so every record
    of all three shards is exported, each once."""
    port = free_port()
    larger = start_proxy(
        fake_upstream.url, tmp_path, "--workers", "3", "--reconcile-interval", "0",
        "--journal", str(tmp_path / "j.sqlite"), port=port,
    )  # fmt: skip
    try:
        larger.wait_ready("/readyz", 60)
        statuses = await spread(larger.url, 90, connections=90)
    finally:
        larger.stop()
    assert statuses == [200] * 90
    held = shard_records(tmp_path / "j.sqlite")
    assert len(held) == 3
    assert all(held.values()), {p.name: len(r) for p, r in held.items()}
    journaled = {r.record_id for shard in held.values() for r in shard}
    exported = tmp_path / "records.jsonl"
    smaller = start_pod(fake_upstream.url, tmp_path, "--jsonl", str(exported), port=port)
    try:
        deadline = time.monotonic() + 30
        while len(exported_ids(exported)) < len(journaled) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
    finally:
        smaller.stop()
    ids = exported_ids(exported)
    assert sorted(ids) == sorted(journaled)
    assert "shard_adopted" in smaller.log.read_text()


def exported_ids(path: Path) -> list[str]:
    """The record ids of a JSON-lines export, as often as they appear."""
    if not path.exists():
        return []
    return [json.loads(line)["record_id"] for line in path.read_text().splitlines() if line]


def test_sighup_reaches_every_worker(fake_upstream: Process, tmp_path: Path) -> None:
    """SIGHUP to the supervisor is forwarded: each worker reloads the key file on it (its
    log says why: SIGHUP), the new key works on every new connection, and the pod serves
    on."""
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"acme: {key_digest('sk-old')}\n")
    proxy = start_pod(fake_upstream.url, tmp_path, "--api-keys", str(keys))
    try:
        keys.write_text(f"acme: {key_digest('sk-new')}\n")
        proxy.popen.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while reloads(proxy) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert reloads(proxy) == 2, proxy.tail()
        assert {key_status(proxy.url, "sk-new") for _ in range(20)} == {200}
        assert {key_status(proxy.url, "sk-old") for _ in range(20)} == {401}
        assert proxy.popen.poll() is None
    finally:
        proxy.stop()


def reloads(proxy: Process) -> int:
    """Workers that reloaded the key file on SIGHUP (one log line each)."""
    lines = proxy.log.read_text().splitlines()
    return sum('"keys_loaded"' in line and '"why": "SIGHUP"' in line for line in lines)


def key_status(url: str, key: str) -> int:
    """An embedding with ``key``, on a new connection (either worker may take it)."""
    return status_with_key(url, key, "/v1/embeddings", {"model": "minilm", "input": "hi"})


async def test_sigterm_under_load_drains_every_worker(
    fake_upstream: Process, tmp_path: Path
) -> None:
    """SIGTERM to the supervisor alone, mid-load: it forwards it, every worker drains,
    the pod exits 0, and every answer a client received has its record in a shard."""
    proxy = start_pod(fake_upstream.url, tmp_path)
    ids: list[str] = []

    async def client(session: aiohttp.ClientSession, n: int) -> None:
        for i in range(30):  # a few seconds of load: the drain serves what is in flight
            body = {"model": "minilm", "input": f"client {n} request {i}"}
            try:
                async with session.post(proxy.url + "/v1/embeddings", json=body) as resp:
                    await resp.read()
                    if resp.status == 200:
                        ids.append(resp.headers["x-usage-record-id"])
            except aiohttp.ClientError:
                return

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=32)) as session:
        clients = asyncio.gather(*(client(session, n) for n in range(32)))
        while len(ids) < 100:
            await asyncio.sleep(0.01)
        proxy.popen.send_signal(signal.SIGTERM)
        await clients
    code = proxy.popen.wait(60)
    assert code == 0, proxy.tail()
    journaled = {
        r.record_id for shard in shard_records(tmp_path / "j.sqlite").values() for r in shard
    }
    assert len(ids) < 32 * 30, "the SIGTERM must interrupt the load"
    assert [i for i in ids if i not in journaled] == []
    assert "pod_draining" in proxy.log.read_text()


async def test_the_admin_port_is_the_pods(fake_upstream: Process, tmp_path: Path) -> None:
    """--admin-port is served by the supervisor: the pod's /metrics (both workers
    summed), its /readyz naming the workers, /healthz and vLLM's /upstream/metrics; the
    main port then refuses /metrics as one process does."""
    admin = free_port()
    proxy = start_pod(fake_upstream.url, tmp_path, "--admin-port", str(admin))
    admin_url = f"http://127.0.0.1:{admin}"
    try:
        before = metric(fake_upstream.url)
        assert await spread(proxy.url, 40, connections=16) == [200] * 40
        engine = metric(fake_upstream.url) - before
        status, body = readyz(admin_url)
        page = metric_sums(admin_url)
        _, upstream = fetch(admin_url + "/upstream/metrics")
        healthy, _ = fetch(admin_url + "/healthz")
        main, _ = fetch(proxy.url + "/metrics")
    finally:
        proxy.stop()
    assert status == 200, body
    assert body["workers"] == {"0": "ready", "1": "ready"}
    assert page["usage_proxy_billed_prompt_tokens_total"] == engine
    assert page["usage_proxy_workers_ready"] == 2
    assert "vllm:prompt_tokens_total" in upstream
    assert healthy == 200
    assert main == 404


def fetch(url: str) -> tuple[int, str]:
    """GET ``url``: its status and body, errors included."""
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def test_a_hung_worker_is_killed_and_replaced(fake_upstream: Process, tmp_path: Path) -> None:
    """A worker whose loop stops answering (SIGSTOP: no state on the control channel for
    10 s) is killed and started again: it would hold its connections for ever."""
    proxy = start_pod(fake_upstream.url, tmp_path)
    try:
        hung = workers_of(proxy)[-1]
        os.kill(hung, signal.SIGSTOP)
        deadline = time.monotonic() + 40
        while hung in workers_of(proxy) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert hung not in workers_of(proxy)
        while readyz(proxy.url)[0] != 200 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        status, body = readyz(proxy.url)
        restarts = metric_sums(proxy.url)["usage_proxy_worker_restarts_total"]
    finally:
        proxy.stop()
    assert status == 200, body
    assert restarts == 1
    assert "worker_hung" in proxy.log.read_text()
