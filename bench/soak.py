"""Bounded soak: a fixed request rate through the proxy (loopback only), sampling the
proxy's memory, open files, event-loop tasks and journal size; they must stay flat.

    python bench/soak.py --minutes 10 --rate 50
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import (
    JSON,
    Process,
    rss_mb,
    start_audited_proxy,
    start_upstream,
)
from bench.workload import request


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def size_mb(path: Path) -> float:
    return round(path.stat().st_size / 2**20, 2)


async def metric(session: aiohttp.ClientSession, url: str, name: str) -> float:
    """An unlabelled series from the proxy's /metrics; -1 if it is missing."""
    async with session.get(url + "/metrics") as resp:
        families = text_string_to_metric_families(await resp.text())
    found = (s.value for f in families for s in f.samples if s.name == name and not s.labels)
    return next(found, -1.0)


class Counts:
    """Requests sent and failed so far."""

    def __init__(self) -> None:
        self.sent = self.failed = 0


async def send(session: aiohttp.ClientSession, url: str, body: bytes, counts: Counts) -> None:
    """One request; a failure is counted, never raised, so the rate holds."""
    try:
        async with session.post(url, data=body, headers=JSON) as r:
            await r.read()
            counts.failed += r.status != 200
    except aiohttp.ClientError:
        counts.failed += 1


async def sample(
    session: aiohttp.ClientSession, proxy: Process, journal: Path, elapsed: float, counts: Counts
) -> dict[str, float]:
    pid = proxy.popen.pid
    return {
        "t": round(elapsed, 1),
        "sent": counts.sent,
        "failed": counts.failed,
        "rss_mb": round(rss_mb(pid), 1),
        "open_files": open_files(pid),
        "tasks": await metric(session, proxy.url, "usage_proxy_event_loop_tasks"),
        "journal_mb": size_mb(journal),
    }


async def drive(args: argparse.Namespace, proxy: Process, journal: Path) -> list[dict[str, float]]:
    """``--rate`` requests per second for ``--minutes``, sampled every ``--sample`` s."""
    path, body = request("rerank 1x64")
    samples: list[dict[str, float]] = []
    deadline = time.monotonic() + args.minutes * 60
    counts = Counts()
    async with aiohttp.ClientSession() as session:
        pending: set[asyncio.Task[None]] = set()  # the loop holds tasks only weakly
        next_sample = time.monotonic()
        while time.monotonic() < deadline:
            task = asyncio.create_task(send(session, proxy.url + path, body, counts))
            pending.add(task)
            task.add_done_callback(pending.discard)
            counts.sent += 1
            if time.monotonic() >= next_sample:
                elapsed = args.minutes * 60 - (deadline - time.monotonic())
                samples.append(await sample(session, proxy, journal, elapsed, counts))
                print(json.dumps(samples[-1]), flush=True)
                next_sample += args.sample
            await asyncio.sleep(1 / args.rate)
        await asyncio.gather(*pending)
    return samples


async def soak(args: argparse.Namespace, workdir: Path) -> list[dict[str, float]]:
    upstream = start_upstream(args.latency, workdir)
    journal = workdir / "journal.sqlite"
    proxy: Process | None = None
    try:
        upstream.wait_ready("/health", 60)  # the proxy reads its /version and /v1/models
        proxy = start_audited_proxy(upstream.url, workdir, journal, *args.proxy_extra.split())
        proxy.wait_ready("/readyz", 60)
        return await drive(args, proxy, journal)
    finally:
        if proxy is not None:
            proxy.stop()
        upstream.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=50.0, help="requests per second")
    parser.add_argument("--latency", type=float, default=25.0, help="upstream ms")
    parser.add_argument("--sample", type=float, default=15.0, help="seconds between samples")
    parser.add_argument("--proxy-extra", default="", help="extra usage-proxy serve options")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="usage-proxy-soak-") as tmp:
        samples = asyncio.run(soak(args, Path(tmp)))
    half = samples[len(samples) // 2 :]
    for key in ("rss_mb", "open_files", "tasks"):
        print(
            f"{key}: first {samples[0][key]}, mid {half[0][key]}, last {samples[-1][key]}, "
            f"max {max(s[key] for s in samples)}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
