"""kill -9 under concurrent load, restart: every response a client received has exactly
one record in the PostgreSQL ledger after delivery (0 lost, 0 duplicated)."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from pathlib import Path

from scripts.vllm_cpu import Process, free_port
from tests.support.load import fire
from tests.support.postgres import Cluster, fresh_database
from tests.support.processes import in_ledger, start_ledgered_proxy


async def test_kill_minus_nine_loses_nothing(
    postgres: Cluster, fake_upstream: Process, tmp_path: Path
) -> None:
    """Crash mid-load, restart on the same journal, then check the ledger id by id."""
    dsn = await fresh_database(postgres)
    port = free_port()
    args = ("--instance", "crash-test")
    proxy = start_ledgered_proxy(fake_upstream.url, tmp_path, dsn, *args, port=port)
    received: list[str] = []
    first = [f"crash-{uuid.uuid4().hex}" for _ in range(400)]
    load = asyncio.create_task(fire(proxy.url, first, received, concurrency=16))
    while len(received) < 120:
        await asyncio.sleep(0.01)
    os.killpg(proxy.popen.pid, signal.SIGKILL)
    proxy.popen.wait(10)
    await load
    crashed_at = len(received)
    assert crashed_at < len(first), "the crash must interrupt the load"

    restarted = start_ledgered_proxy(fake_upstream.url, tmp_path, dsn, *args, port=port)
    second = [f"after-{uuid.uuid4().hex}" for _ in range(100)]
    await fire(restarted.url, second, received, concurrency=8)
    try:
        ledger, total, distinct = await in_ledger(dsn, received)
    finally:
        restarted.stop()
    lost = [i for i in received if i not in ledger]
    print(
        f"crash test: {crashed_at} responses before kill -9, {len(received)} in all, "
        f"{total} ledger rows, {len(lost)} lost, {total - distinct} duplicated"
    )
    assert lost == []
    assert total == distinct
    assert len(received) >= crashed_at + 100
