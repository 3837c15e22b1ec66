"""The journal fails loudly, never silently (issue #10, items 13-14): a deleted journal
file, a read-only and a frozen file system, each a real one where the machine allows."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy.ledger.journal_files import read_journal
from proxy.serving.keys import METRICS, RECORDER
from tests.support.proxies import fake_and_proxy

RERANK = {"query": "What is the capital of France?", "documents": ["Paris.", "Berlin."]}


def can_mount() -> bool:
    return os.geteuid() == 0 and shutil.which("mount") is not None


def run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


@contextlib.contextmanager
def loop_ext4(where: Path, image: Path) -> Iterator[Path]:
    """A loop-mounted ext4 (fsfreeze needs a real block file system), root only."""
    where.mkdir()
    try:
        run("truncate", "-s", "16M", str(image))
        run("mkfs.ext4", "-q", "-F", str(image))
        run("mount", "-o", "loop,errors=remount-ro", str(image), str(where))
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        pytest.skip(f"cannot loop-mount ext4 here: {exc}")
    try:
        yield where
    finally:
        subprocess.run(["fsfreeze", "-u", str(where)], check=False, capture_output=True)
        subprocess.run(["umount", "-l", str(where)], check=False)


async def proxy_on(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, journal: Path, **options: Any
) -> Any:
    _, client = await fake_and_proxy(
        aiohttp_server, aiohttp_client, minilm_path, journal=str(journal), **options
    )
    return client


async def test_deleted_journal_is_recreated_and_nothing_is_lost(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """Regression: with the file deleted, writes went to the unlinked inode and a restart
    found an empty journal. Now the file is recreated, with the old records carried over,
    an error logged and a metric counted."""
    path = tmp_path / "journal.sqlite"
    client = await proxy_on(aiohttp_server, aiohttp_client, minilm_path, path)
    first = await client.post("/rerank", json=RERANK)
    path.unlink()
    second = await client.post("/rerank", json=RERANK)
    assert second.status == 200
    assert "x-usage-record" not in second.headers
    assert path.exists()
    journaled = [json.loads(body)["record_id"] for body in read_journal(path)]
    assert journaled == [first.headers["x-usage-record-id"], second.headers["x-usage-record-id"]]
    assert client.app[METRICS].journal_replaced._value.get() == 1


@pytest.mark.skipif(not can_mount(), reason="needs root to mount a file system")
async def test_read_only_file_system_flags_records_and_readiness(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """Regression: on a read-only file system every record failed while /readyz said 200.

    The file system is made read-only the way a failing disk does it: ext4 aborts its
    journal (``remount,abort``) and turns read-only under the open journal file.
    """
    with loop_ext4(tmp_path / "mnt", tmp_path / "fs.img") as mnt:
        client = await proxy_on(aiohttp_server, aiohttp_client, minilm_path, mnt / "j.sqlite")
        assert (await client.get("/readyz")).status == 200
        run("mount", "-o", "remount,abort", str(mnt))
        resp = await client.post("/rerank", json=RERANK)
        assert resp.status == 200
        assert resp.headers["x-usage-record"] == "failed"
        for _ in range(2):  # the readiness probe's own test write fails too
            ready = await client.get("/readyz")
            assert ready.status == 503
            assert "journal" in (await ready.json())["problems"]
        assert "usage_proxy_journal_ready 0.0" in client.app[METRICS].render().decode()
        assert client.app[METRICS].journal_failures._value.get() == 1
        await client.close()


@pytest.mark.skipif(
    not can_mount() or shutil.which("fsfreeze") is None, reason="needs root and fsfreeze"
)
async def test_frozen_file_system_bounds_the_commit(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """Regression: with the journal's file system frozen, scoring requests hung with no
    timeout while /healthz and /readyz said 200. Now the answer goes out after the commit
    bound, flagged; /readyz says not ready; after the thaw the record is committed."""
    with loop_ext4(tmp_path / "mnt", tmp_path / "fs.img") as mnt:
        path = mnt / "j.sqlite"
        client = await proxy_on(
            aiohttp_server, aiohttp_client, minilm_path, path, journal_commit_timeout=0.5
        )
        await client.post("/rerank", json=RERANK)
        run("fsfreeze", "-f", str(mnt))
        try:
            started = time.monotonic()
            resp = await client.post("/rerank", json=RERANK)
            took = time.monotonic() - started
            assert resp.status == 200
            assert resp.headers["x-usage-record"] == "failed"
            assert took < 3
            ready = await client.get("/readyz")
            assert ready.status == 503
            assert "journal" in (await ready.json())["problems"]
            assert (await client.get("/healthz")).status == 200
        finally:
            run("fsfreeze", "-u", str(mnt))
        for _ in range(100):
            if client.app[RECORDER].journal.healthy:
                break
            await asyncio.sleep(0.05)
        assert (await client.get("/readyz")).status == 200
        frozen_id = resp.headers["x-usage-record-id"]
        assert any(frozen_id in body for body in read_journal(path))
        await client.close()
