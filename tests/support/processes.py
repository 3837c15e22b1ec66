"""The fake vLLM and the proxy as processes of their own, for tests that kill or signal."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import urllib.error
import urllib.request
from pathlib import Path

import asyncpg
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from proxy.ledger.records import UsageRecord
from proxy.ledger.shards import shards
from proxy.ledger.windows import SettledWindow
from scripts.vllm_cpu import Process, _spawn, free_port, start_proxy


def start_fake(
    root: Path, workdir: Path, version: str = "0.29.0", name: str = "minilm", delay: float = 0.0
) -> Process:
    """``python -m tests.support.fakevllm`` (``version``, the tokenizer in ``root``, the
    model served as ``name``, scoring answers ``delay`` seconds late), ready."""
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "tests.support.fakevllm",
        *("--port", str(port), "--root", str(root), "--version", version, "--name", name),
        *("--delay", str(delay)),
    ]
    log = workdir / ("fake.log" if version == "0.29.0" else f"fake-{version}.log")
    fake = _spawn("fake-vllm", argv, {"HF_HUB_OFFLINE": "1"}, log, port)
    try:
        fake.wait_ready("/health", 60)
    except BaseException:
        fake.stop()
        raise
    return fake


def start_ledgered_proxy(
    upstream: str, workdir: Path, dsn: str, *args: str, port: int | None = None
) -> Process:
    """``usage-proxy serve`` journalling to ``workdir/j.sqlite`` and exporting to the
    PostgreSQL ledger ``dsn`` (other flags: ``args``), ready."""
    journal = ("--journal", str(workdir / "j.sqlite"), "--ledger-dsn", dsn)
    proxy = start_proxy(upstream, workdir, *journal, *args, port=port or free_port())
    proxy.wait_ready("/readyz", 60)
    return proxy


def workers_of(proxy: Process) -> list[int]:
    """The worker pids of a ``serve --workers N`` pod (its supervisor's children)."""
    pid = proxy.popen.pid
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(child) for child in text.split()]


def shard_records(journal: Path) -> dict[Path, list[UsageRecord]]:
    """Every shard of ``journal`` with the usage records it holds itself."""
    return {
        shard: [UsageRecord.from_json(b) for b in _bodies(shard, "usage")]
        for shard in shards(journal)
    }


def shard_windows(journal: Path) -> dict[Path, list[SettledWindow]]:
    """Every shard of ``journal`` with the reconciliation windows it holds itself."""
    return {
        shard: [SettledWindow.model_validate_json(b) for b in _bodies(shard, "reconciliation")]
        for shard in shards(journal)
    }


def _bodies(shard: Path, kind: str) -> list[str]:
    """The bodies of one shard's records of ``kind``, in append order, read-only."""
    db = sqlite3.connect(f"file:{shard}?mode=ro", uri=True)
    try:
        query = "SELECT body FROM records WHERE kind = ? ORDER BY seq"
        return [str(body) for (body,) in db.execute(query, (kind,))]
    finally:
        db.close()


def metric_samples(url: str) -> list[Sample]:
    """Every sample of ``url``'s /metrics, fetched on a new connection (in a pod the
    kernel may hand it to either worker)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def metric_sums(url: str) -> dict[str, float]:
    """``url``'s /metrics, each sample name's values summed."""
    sums: dict[str, float] = {}
    for sample in metric_samples(url):
        sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    return sums


async def in_ledger(dsn: str, ids: list[str]) -> tuple[set[str], int, int]:
    """The PostgreSQL ledger's record ids once ``ids`` are all there (or 20 s passed), its
    rows and its distinct ids."""
    conn = await asyncpg.connect(dsn)
    try:
        for _ in range(200):
            rows = await conn.fetch("SELECT record_id::text AS id FROM usage_records")
            if set(ids) <= {r["id"] for r in rows}:
                break
            await asyncio.sleep(0.1)
        total = await conn.fetchval("SELECT count(*) FROM usage_records")
        distinct = await conn.fetchval("SELECT count(DISTINCT record_id) FROM usage_records")
    finally:
        await conn.close()
    return {r["id"] for r in rows}, total, distinct


def readiness(proxy: Process) -> dict[str, object]:
    """The /readyz body (503 included) of whichever process the new connection reached."""
    try:
        with urllib.request.urlopen(proxy.url + "/readyz", timeout=5) as resp:
            return dict(json.loads(resp.read()))
    except urllib.error.HTTPError as exc:
        return dict(json.loads(exc.read()))


def status_with_key(url: str, key: str, path: str, body: dict[str, object]) -> int:
    """The status of a POST of ``body`` to ``path`` with the API key ``key``, on a new
    connection (in a pod, either worker may take it)."""
    request = urllib.request.Request(
        url + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code
