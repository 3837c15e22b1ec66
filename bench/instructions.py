"""Instructions per audited request, counted by callgrind: repeatable on a shared machine,
where CPU time moves by 20 % from run to run and wall-clock time means little.

    python bench/instructions.py                       # every target on both event loops
    python bench/instructions.py --targets proxy-sync --event-loops uvloop --keep DIR

    python bench/instructions.py --targets proxy-sync --scenario embeddings  # issue #42's x1
    python bench/instructions.py --targets proxy-sync --scenario "rerank 1x64 unique docs"
    python bench/instructions.py --targets proxy-sync --limits "token budget"

Each target runs under ``valgrind --tool=callgrind`` with collection off; after warm-up
requests (count cache filled, code paths translated) collection is switched on and the
counters zeroed, ``--requests`` requests of ``--scenario`` (cache-hit reranks 1x64 by
default; ``embeddings``: one short input; ``rerank 1x64 unique docs``: documents no
request sent before, each a full recount) are sent sequentially at 0 ms upstream, and
the dump's total (all threads) is divided by their number. ``--keep`` keeps the
dumps for ``callgrind_annotate``. The fake upstream and the client run outside valgrind.
``--limits`` gives the proxy a limits file and sends every request as the tenant
``acme`` (``--tenant-header``): ``token budget``, the tenant's prompt tokens budgeted per
day, so every request is priced and reserved; ``other tenant``, only another tenant
limited, so admission finds no limit for ``acme``; ``none`` (the default), no file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import (
    EVENT_LOOPS,
    LOOP_ENV,
    ROOT,
    Process,
    free_port,
    sequential,
    start_upstream,
)
from bench.workload import SCENARIOS, UNIQUE, request, unique_bodies
from scripts.vllm_cpu import _spawn

TARGETS = ("relay", "durable", "proxy-sync", "proxy-async")
TENANT_HEADER, TENANT = "X-Tenant-Id", "acme"
LIMITS: dict[str, dict[str, Any] | None] = {
    "none": None,
    "other tenant": {"tenants": {"other": {"prompt_tokens_per_day": 10**12}}},
    "token budget": {"tenants": {TENANT: {"prompt_tokens_per_day": 10**12}}},
}


def argv_of(
    target: str, upstream: str, port: int, loop: str, workdir: Path, limits: str = "none"
) -> list[str]:
    """The target's command line (as bench/harness.py starts it, without valgrind)."""
    if target in ("relay", "durable"):
        argv = [sys.executable, str(ROOT / "bench" / "minimal_relay.py"), upstream, str(port)]
        return argv + ([str(workdir / f"relay-{port}.sqlite")] if target == "durable" else [])
    mode = target.removeprefix("proxy-")
    argv = [
        *(sys.executable, "-m", "proxy", "serve", "--upstream", upstream),
        *("--host", "127.0.0.1", "--port", str(port), "--event-loop", loop),
        *("--journal", str(workdir / f"journal-{port}.sqlite"), "--durability", mode),
        *("--log-level", "warning"),
    ]
    policies = LIMITS[limits]
    if policies is None:
        return argv
    path = workdir / f"limits-{port}.json"
    path.write_text(json.dumps(policies))
    return [*argv, "--limits", str(path), "--tenant-header", TENANT_HEADER]


def control(pid: int, *options: str) -> None:
    subprocess.run(["callgrind_control", *options, str(pid)], check=True, capture_output=True)


def total(dump: Path) -> int:
    """The instructions (Ir) of a callgrind dump, all threads."""
    for line in dump.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise ValueError(f"no totals in {dump}")


async def count(
    target: str,
    loop: str,
    upstream: Process,
    workdir: Path,
    requests: int,
    scenario: str = "rerank 1x64",
    limits: str = "none",
) -> float:
    """Million instructions per request of ``scenario`` to ``target`` on ``loop``."""
    port = free_port()
    out = workdir / f"callgrind.{target}.{loop}.{port}"
    argv = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out}",
        *argv_of(target, upstream.url, port, loop, workdir, limits),
    ]
    log = workdir / f"{target}-{loop}.log"
    process = _spawn(target, argv, {LOOP_ENV: loop}, log, port)
    try:
        process.wait_ready("/readyz" if target.startswith("proxy") else "/health", 600)
        path, body = request(scenario)
        bodies = [body] * (30 + requests)
        if scenario == UNIQUE:  # new texts in every request, the fake's answers cached
            bodies = unique_bodies(port, 30 + requests)
            async with aiohttp.ClientSession() as session:
                await sequential(session, upstream.url + path, bodies)
        url = process.url + path
        timeout = aiohttp.ClientTimeout(total=120)
        headers = {} if LIMITS[limits] is None else {TENANT_HEADER: TENANT}
        async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
            await sequential(session, url, bodies[:20])  # translated, cache filled
            control(process.popen.pid, "--instr=on")
            await sequential(session, url, bodies[20:30])
            control(process.popen.pid, "--zero")
            await sequential(session, url, bodies[30:])
            control(process.popen.pid, "--dump")
    finally:
        process.stop()
    # callgrind_control's dump is OUT.1; OUT itself is what ran after it, to the exit.
    return total(out.with_name(out.name + ".1")) / requests / 1e6


async def measure(args: argparse.Namespace, workdir: Path) -> dict[str, dict[str, float]]:
    upstream = start_upstream(0.0, workdir)
    results: dict[str, dict[str, float]] = {}
    try:
        upstream.wait_ready("/health", 60)
        for loop in args.event_loops:
            for target in args.targets:
                figure = await count(
                    target, loop, upstream, workdir, args.requests, args.scenario, args.limits
                )
                results.setdefault(loop, {})[target] = figure
                print(f"{loop:8} {target:12} {figure:.3f} M instructions/request", flush=True)
    finally:
        upstream.stop()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default="rerank 1x64")
    parser.add_argument("--targets", nargs="+", choices=TARGETS, default=list(TARGETS))
    parser.add_argument("--event-loops", nargs="+", choices=EVENT_LOOPS, default=EVENT_LOOPS)
    parser.add_argument("--limits", choices=list(LIMITS), default="none")
    parser.add_argument("--keep", type=Path, help="keep the callgrind dumps in this folder")
    args = parser.parse_args()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        results = asyncio.run(measure(args, args.keep))
    else:
        with tempfile.TemporaryDirectory(prefix="usage-proxy-instructions-") as tmp:
            results = asyncio.run(measure(args, Path(tmp)))
    print("| event loop | " + " | ".join(args.targets) + " |")
    print("|---" * (len(args.targets) + 1) + "|")
    for loop, figures in results.items():
        print(f"| {loop} | " + " | ".join(f"{figures[t]:.2f} M" for t in args.targets) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
