"""How ``SO_REUSEPORT`` spreads a client's load over the workers of ``serve --workers N``
(issue #61), and what a worker killed under load costs the clients.

    .venv/bin/python -m bench.reuseport [--requests 2000] [--workers 2]

``--workers`` aiohttp processes (uvloop; 2 by default) listen on one loopback port with
``reuse_port=True`` and answer each POST after 5 ms (the upstream's time) with their pid.
An aiohttp client sends the requests with a pool of 1, 2, 4, 16 and 64 keep-alive
connections, and with a new connection per request; each row gives the busiest worker's
share (1/N is even). Then, under load over 32 connections, worker 1 is killed with SIGKILL
and started again 0.5 s later: the requests answered, those that failed (by error), and
whether requests sent after the kill were answered. Loopback only; stops by itself (about
15 s).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import multiprocessing as mp
import os
import signal
import socket
import sys
import time
from multiprocessing.process import BaseProcess
from pathlib import Path

import aiohttp
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

FORK = mp.get_context("fork")
POOLS = (1, 2, 4, 16, 64)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def worker(port: int) -> None:
    """One worker: every request answered with this process's pid."""
    import uvloop

    pid = str(os.getpid()).encode()

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        await asyncio.sleep(0.005)  # the upstream's time: requests are in flight
        return web.Response(body=pid)

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/", answer)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, reuse_port=True).start()
        await asyncio.Event().wait()

    uvloop.run(main())


def start(port: int) -> BaseProcess:
    proc = FORK.Process(target=worker, args=(port,), daemon=True)
    proc.start()
    return proc


async def ready(url: str) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(200):
            try:
                async with session.post(url, data=b"{}") as response:
                    await response.read()
                    return
            except aiohttp.ClientError:
                await asyncio.sleep(0.05)
    raise RuntimeError("the workers did not start")


async def spread(url: str, requests: int, pool: int | None) -> float:
    """The busiest worker's share of ``requests`` sent over ``pool`` keep-alive
    connections (None: a new connection per request)."""
    connector = aiohttp.TCPConnector(limit=pool or 64, force_close=pool is None)
    counts: collections.Counter[bytes] = collections.Counter()
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> None:
            async with session.post(url, data=b"{}") as response:
                counts[await response.read()] += 1

        await asyncio.gather(*(one() for _ in range(requests)))
    return max(counts.values()) / requests


async def kill_under_load(url: str, port: int, victim: BaseProcess, requests: int) -> list[str]:
    """Worker 1 killed (SIGKILL) after a third of the requests, started again 0.5 s later."""
    answered, errors = 0, collections.Counter[str]()
    third = asyncio.Event()
    after_kill = [0, 0]  # answered, failed: requests sent after the kill
    killed_at: float | None = None
    connector = aiohttp.TCPConnector(limit=32)
    async with aiohttp.ClientSession(connector=connector) as session:
        gate = asyncio.Semaphore(32)

        async def one() -> None:
            nonlocal answered
            async with gate:
                sent = time.monotonic()
                try:
                    async with session.post(url, data=b"{}") as response:
                        await response.read()
                    answered += 1
                    ok = True
                    if answered >= requests // 3:
                        third.set()
                except (aiohttp.ClientError, OSError) as exc:
                    errors[type(exc).__name__] += 1
                    ok = False
                if killed_at is not None and sent > killed_at:
                    after_kill[0 if ok else 1] += 1

        tasks = [asyncio.create_task(one()) for _ in range(requests)]
        await third.wait()
        assert victim.pid is not None
        os.kill(victim.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        await asyncio.sleep(0.5)
        replacement = start(port)
        await asyncio.gather(*tasks)
    replacement.kill()
    failed = ", ".join(f"{n} {name}" for name, n in errors.most_common()) or "none"
    return [
        f"- requests: {requests}; answered: {answered}; failed: {failed}",
        f"- sent after the kill: {after_kill[0]} answered, {after_kill[1]} failed",
    ]


async def measure(requests: int, count: int = 2) -> list[str]:
    """The spread over ``count`` workers for every pool, then worker 1 killed under load."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    workers = [start(port) for _ in range(count)]
    await ready(url)
    lines = ["| client connections | busiest worker's share of the requests |", "|---|---|"]
    for pool in (*POOLS, None):
        share = await spread(url, requests, pool)
        name = "a new one per request" if pool is None else f"{pool} (keep-alive)"
        lines.append(f"| {name} | {share:.2f} |")
    lines += ["", "Worker 1 killed with SIGKILL under load (32 connections):", ""]
    lines += await kill_under_load(url, port, workers[1], requests)
    for proc in workers:
        proc.kill()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="per row (default 2000)")
    parser.add_argument("--workers", type=int, default=2, help="processes on the port (>= 2)")
    args = parser.parse_args()
    if args.workers < 2:
        parser.error("--workers: at least 2 (worker 1 is the one killed)")
    print(f"## SO_REUSEPORT, {args.workers} workers ({os.cpu_count()} CPUs)\n")
    print("\n".join(asyncio.run(measure(args.requests, args.workers))))


if __name__ == "__main__":
    main()
