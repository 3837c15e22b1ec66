"""``usage-proxy serve --workers 2`` attacked as a bad day would (issue #61's probe): the
supervisor SIGKILLed while its workers still hold their shards; a pod rolled back to one
process."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import signal
import time
from pathlib import Path

import aiohttp
import yaml
from redis.asyncio import Redis

from scripts.vllm_cpu import Process, free_port, start_proxy
from tests.support.processes import metric_samples, shard_records, workers_of
from tests.support.redisserver import Store

POD = ("--workers", "2", "--reconcile-interval", "0")
# a store answer late on this loaded 2-core box is a 503, never a pass
STORED = ("--limits-replicas", "1", "--limits-fail-mode", "closed", "--limits-store-timeout", "2")


def start_pod(upstream: str, workdir: Path, port: int) -> Process:
    """``serve --workers 2`` journalling to ``workdir/j.sqlite``, ready."""
    journal = ("--journal", str(workdir / "j.sqlite"))
    proxy = start_proxy(upstream, workdir, *POD, *journal, port=port)
    proxy.wait_ready("/readyz", 60)
    return proxy


def alive(pid: int) -> bool:
    """``pid`` runs (or is stopped), neither gone nor a zombie waiting for its reaper."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def lock_is_free(path: Path) -> bool:
    """Whether another pod could take ``path`` (the pod's journal lock) now."""
    with path.open("a") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
        return True


def test_a_killed_supervisors_workers_keep_the_journal_until_they_exit(
    fake_upstream: Process, tmp_path: Path
) -> None:
    """The supervisor SIGKILLed while both workers still run (held stopped here, as a
    worker still draining its exchanges is): the journal's lock stays held, so no second
    pod starts writing the same shards beside them, and so does their runtime
    directory's. Once they have drained and exited the locks are free, and the next pod
    takes the journal and the port, and removes the runtime directory left behind."""
    port = free_port()
    proxy = start_pod(fake_upstream.url, tmp_path, port)
    lock = tmp_path / "j.sqlite.lock"
    pids = workers_of(proxy)
    assert len(pids) == 2
    environ = Path(f"/proc/{pids[0]}/environ").read_bytes().split(b"\0")
    metrics = next(v for v in environ if v.startswith(b"PROMETHEUS_MULTIPROC_DIR="))
    runtime = Path(os.fsdecode(metrics.partition(b"=")[2])).parent
    try:
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        os.kill(proxy.popen.pid, signal.SIGKILL)
        proxy.popen.wait(10)
        held_while_alive = not lock_is_free(lock)
        runtime_held = not lock_is_free(runtime / "pod.lock")
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
        deadline = time.monotonic() + 60
        while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(alive(pid) for pid in pids), "the workers outlived their supervisor"
        assert held_while_alive, "the journal lock was free while the old workers ran"
        assert runtime_held, "the runtime directory's lock was free while the old workers ran"
        assert lock_is_free(lock)
        assert lock_is_free(runtime / "pod.lock")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proxy.popen.pid, signal.SIGCONT)
            os.killpg(proxy.popen.pid, signal.SIGKILL)
    after = start_pod(fake_upstream.url, tmp_path, port)
    try:
        assert len(workers_of(after)) == 2
        assert not runtime.exists()
    finally:
        after.stop()
    assert after.popen.returncode == 0, after.tail()


def limited(workdir: Path, requests: int) -> tuple[str, ...]:
    """A month of ``requests`` small embeddings' prompt tokens for tenant acme."""
    limits = workdir / "limits.yaml"
    budget = {"prompt_tokens_per_month": requests * 3}  # "hi": 3 prompt tokens with MiniLM
    limits.write_text(yaml.safe_dump({"tenants": {"acme": budget}}))
    return ("--limits", str(limits), "--tenant-header", "X-Tenant-Id")


async def one_by_one(url: str, count: int) -> list[int]:
    """``count`` embeddings for acme, each on a new connection (either worker's)."""
    statuses = []
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(count):
            body = {"model": "minilm", "input": "hi"}
            headers = {"X-Tenant-Id": "acme"}
            async with session.post(url + "/v1/embeddings", json=body, headers=headers) as resp:
                await resp.read()
                statuses.append(resp.status)
    return statuses


async def test_a_pod_rolled_back_to_one_process_keeps_its_month_and_records(
    fake_upstream: Process, tmp_path: Path
) -> None:
    """A pod of 2 spends 20 of a 30-request month through both workers without an
    exporter; the same journal then serves as one process (``--workers 1``, the
    default, with a JSON-lines exporter): it is a pod of one, so it adopts worker 1's
    shard: exactly 10 more are admitted, and every record of both shards is exported."""
    port = free_port()
    journal = ("--journal", str(tmp_path / "j.sqlite"), *limited(tmp_path, 30))
    pod = start_proxy(fake_upstream.url, tmp_path, *POD, *journal, port=port)
    try:
        pod.wait_ready("/readyz", 60)
        first = await one_by_one(pod.url, 20)
    finally:
        pod.stop()
    assert first == [200] * 20
    held = shard_records(tmp_path / "j.sqlite")
    sizes = {p.name: len(r) for p, r in held.items()}
    assert len(held) == 2, sizes
    assert all(held.values()), sizes
    journaled = sorted(r.record_id for shard in held.values() for r in shard)
    exported = tmp_path / "records.jsonl"
    single = start_proxy(
        fake_upstream.url, tmp_path, "--reconcile-interval", "0", *journal,
        "--jsonl", str(exported), port=port,
    )  # fmt: skip
    try:
        single.wait_ready("/readyz", 60)
        second = await one_by_one(single.url, 12)
        deadline = time.monotonic() + 15
        while len(exported_ids(exported)) < len(journaled) + 10 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
    finally:
        single.stop()
    ids = exported_ids(exported)
    unexported = len(set(journaled) - set(ids))
    assert (second.count(200), unexported) == (10, 0), (second, unexported)
    assert second == [200] * 10 + [429] * 2
    assert len(ids) == len(set(ids))


def exported_ids(path: Path) -> list[str]:
    """The record ids of a JSON-lines export, as often as they appear."""
    if not path.exists():
        return []
    return [json.loads(line)["record_id"] for line in path.read_text().splitlines() if line]


def test_a_sighup_during_a_workers_restart_does_not_kill_it(
    fake_upstream: Process, tmp_path: Path
) -> None:
    """SIGHUP to the supervisor while a worker it restarted is still starting (before it
    handles SIGHUP, whose default action ends a process): the worker is not killed by
    it (it reads its files as it starts, and watches them); the only restart is the one
    the SIGKILL caused, and both workers are ready again."""
    proxy = start_pod(fake_upstream.url, tmp_path, free_port())
    try:
        pids = workers_of(proxy)
        os.kill(pids[1], signal.SIGKILL)
        deadline = time.monotonic() + 15
        while not set(workers_of(proxy)) - set(pids) and time.monotonic() < deadline:
            time.sleep(0.01)
        proxy.popen.send_signal(signal.SIGHUP)
        time.sleep(3)
        proxy.wait_ready("/readyz", 30)
        exits = [line for line in proxy.log.read_text().splitlines() if "worker_exited" in line]
    finally:
        proxy.stop()
    assert proxy.popen.returncode == 0, proxy.tail()
    assert len(exits) == 1, exits
    assert "SIGKILL" in exits[0], exits


async def test_a_smaller_pod_with_a_store_counts_the_shards_it_adopted(
    fake_upstream: Process, tmp_path: Path, redis_store: Store
) -> None:
    """A pod of 3 replicas of a redis store spends 20 of a 30-request month; the store
    then loses every key, and the same journal serves 2 workers: the store is rebuilt
    from every shard, worker 2's adopted by worker 0, so exactly 10 more are admitted."""
    port = free_port()
    stored = ("--limits-store", redis_store.url, *STORED)
    journal = ("--journal", str(tmp_path / "j.sqlite"), *limited(tmp_path, 30), *stored)
    larger = start_proxy(
        fake_upstream.url, tmp_path, "--workers", "3", "--reconcile-interval", "0",
        *journal, port=port,
    )  # fmt: skip
    try:
        larger.wait_ready("/readyz", 60)
        first = await one_by_one(larger.url, 20)
    finally:
        larger.stop()
    assert first == [200] * 20
    held = [len(records) for records in shard_records(tmp_path / "j.sqlite").values()]
    assert len(held) == 3, held
    assert held[2], held
    client = Redis.from_url(redis_store.url)
    try:
        await client.flushall()
    finally:
        await client.aclose()
    smaller = start_proxy(fake_upstream.url, tmp_path, *POD, *journal, port=port)
    try:
        smaller.wait_ready("/readyz", 60)
        second = await one_by_one(smaller.url, 12)
    finally:
        smaller.stop()
    assert second == [200] * 10 + [429] * 2, (second.count(200), held)


async def acme(session: aiohttp.ClientSession, url: str) -> int:
    """One small embedding for acme, sent again after a connection error (a worker
    killed under it resets its connections); its status."""
    body = {"model": "minilm", "input": "hi"}
    for _ in range(100):
        try:
            async with session.post(
                url + "/v1/embeddings", json=body, headers={"X-Tenant-Id": "acme"}
            ) as resp:
                await resp.read()
                return resp.status
        except aiohttp.ClientConnectionError:
            await asyncio.sleep(0.05)
    raise AssertionError("never answered")


async def test_a_burst_while_a_worker_is_killed_spends_the_month_exactly(
    fake_upstream: Process, tmp_path: Path
) -> None:
    """A month of 40 requests, a burst of 100 over new connections, one worker
    SIGKILLed in the middle of it: once it is back, the month's requests answered 200
    and billed in the shards are exactly 40 (the killed worker's held units neither
    overshoot nor stay stranded)."""
    journal = ("--journal", str(tmp_path / "j.sqlite"), *limited(tmp_path, 40))
    proxy = start_proxy(fake_upstream.url, tmp_path, *POD, *journal, port=free_port())
    try:
        proxy.wait_ready("/readyz", 60)
        victim = workers_of(proxy)[1]
        connector = aiohttp.TCPConnector(force_close=True, limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            burst = [asyncio.create_task(acme(session, proxy.url)) for _ in range(100)]
            await asyncio.sleep(0.15)
            os.kill(victim, signal.SIGKILL)
            first = await asyncio.gather(*burst)
        proxy.wait_ready("/readyz", 60)
        deadline = time.monotonic() + 30
        while victim in workers_of(proxy) or len(workers_of(proxy)) < 2:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.2)
        await asyncio.sleep(2)
        rest = await one_by_one(proxy.url, 50)
    finally:
        proxy.stop()
    billed = sum(
        r.tenant == "acme" for rs in shard_records(tmp_path / "j.sqlite").values() for r in rs
    )
    answered = first.count(200) + rest.count(200)
    assert (answered, billed) == (40, 40), (first.count(200), rest.count(200), billed, proxy.tail())


async def embed_as(session: aiohttp.ClientSession, url: str, tenant: str) -> int:
    """One small embedding for ``tenant`` (retried after a connection error); its status."""
    body = {"model": "minilm", "input": "hi"}
    for _ in range(100):
        try:
            async with session.post(
                url + "/v1/embeddings", json=body, headers={"X-Tenant-Id": tenant}
            ) as resp:
                await resp.read()
                return resp.status
        except aiohttp.ClientConnectionError:
            await asyncio.sleep(0.05)
    raise AssertionError("never answered")


def tenant_labels(admin_url: str) -> set[str]:
    """The tenant label values of the pod's /metrics (``other`` included)."""
    return {s.labels["tenant"] for s in metric_samples(admin_url) if "tenant" in s.labels}


async def test_the_tenant_label_cap_survives_a_workers_restart(
    fake_upstream: Process, tmp_path: Path
) -> None:
    """--metrics-max-tenants 2 on a pod of 2 (the cap is per worker: at most 2 x 2
    tenant series): 12 tenants over new connections, worker 1 SIGKILLed and started
    again, 12 more tenants: the pod's /metrics still shows at most 4 tenants besides
    ``other`` (the restarted worker counts the series its index already left, whose
    counters stay in the pod's sums)."""
    admin = free_port()
    labelled = (
        "--admin-port", str(admin), "--metrics-tenant-label", "true",
        "--metrics-max-tenants", "2", "--tenant-header", "X-Tenant-Id",
    )  # fmt: skip
    journal = ("--journal", str(tmp_path / "j.sqlite"))
    proxy = start_proxy(fake_upstream.url, tmp_path, *POD, *journal, *labelled, port=free_port())
    admin_url = f"http://127.0.0.1:{admin}"
    try:
        proxy.wait_ready("/readyz", 60)
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session:
            for k in range(12):
                assert await embed_as(session, proxy.url, f"t{k}") == 200
            before = tenant_labels(admin_url) - {"other"}
            victim = workers_of(proxy)[1]
            os.kill(victim, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while victim in workers_of(proxy) or len(workers_of(proxy)) < 2:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.2)
            proxy.wait_ready("/readyz", 60)
            for k in range(12, 24):
                assert await embed_as(session, proxy.url, f"t{k}") == 200
        after = tenant_labels(admin_url) - {"other"}
    finally:
        proxy.stop()
    assert len(before) <= 4, before
    assert len(after) <= 4, (sorted(before), sorted(after))
