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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.run import SCENARIOS, rss_mb, start_upstream  # noqa: E402
from scripts.vllm_cpu import start_proxy  # noqa: E402


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def metric(session: aiohttp.ClientSession, url: str, name: str) -> float:
    async with session.get(url + "/metrics") as resp:
        for line in (await resp.text()).splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return -1.0


async def soak(args: argparse.Namespace, workdir: Path) -> list[dict[str, float]]:
    upstream = start_upstream(args.latency, workdir)
    upstream.wait_ready("/health", 60)
    journal = workdir / "journal.sqlite"
    proxy = start_proxy(
        upstream.url,
        workdir,
        "--journal",
        str(journal),
        "--log-level",
        "warning",
        *args.proxy_extra.split(),
    )
    proxy.wait_ready("/readyz", 60)
    path, payload = SCENARIOS["rerank 1x64"]
    body = json.dumps(payload).encode()
    samples: list[dict[str, float]] = []
    deadline = time.monotonic() + args.minutes * 60
    sent = failed = 0
    try:
        async with aiohttp.ClientSession() as session:
            pending: set[asyncio.Task[None]] = set()

            async def one() -> None:
                nonlocal failed
                try:
                    async with session.post(
                        proxy.url + path, data=body, headers={"Content-Type": "application/json"}
                    ) as r:
                        await r.read()
                        failed += r.status != 200
                except aiohttp.ClientError:
                    failed += 1

            next_sample = time.monotonic()
            while time.monotonic() < deadline:
                task = asyncio.create_task(one())
                pending.add(task)
                task.add_done_callback(pending.discard)
                sent += 1
                if time.monotonic() >= next_sample:
                    pid = proxy.popen.pid
                    samples.append(
                        {
                            "t": round(args.minutes * 60 - (deadline - time.monotonic()), 1),
                            "sent": sent,
                            "failed": failed,
                            "rss_mb": round(rss_mb(pid), 1),
                            "open_files": open_files(pid),
                            "tasks": await metric(
                                session, proxy.url, "usage_proxy_event_loop_tasks"
                            ),
                            "journal_mb": round(journal.stat().st_size / 2**20, 2),
                        }
                    )
                    print(json.dumps(samples[-1]), flush=True)
                    next_sample += args.sample
                await asyncio.sleep(1 / args.rate)
            await asyncio.gather(*pending)
    finally:
        proxy.stop()
        upstream.stop()
    return samples


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
