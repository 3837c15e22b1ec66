"""The proxy's cost as ratios to its floors, both durability modes in one run (issue #29).

These ratios were issue #29's goals; issue #42 retired them (the proxy with no audit at
all already exceeds their budget: docs/performance.md). They are printed as information,
with the bound they once had and no verdict; the full-recount row stays a goal, judged in
bench/render.py's goal table with the comparisons that replaced the rest.

    python bench/ratios.py             # prints the goal table
    python bench/ratios.py --json      # machine-readable

Each mode against the floor that keeps its promise:

- ``--durability sync`` (the default) against the durable floor: the minimal aiohttp relay
  with one fsync'd SQLite commit per request and group commit, before the answer is
  released (``bench/minimal_relay.py JOURNAL``);
- ``--durability async`` against the bare relay.

Per pair: CPU per audited request with count-cache hits (whole-process CPU from /proc),
from sequential requests and at saturation; saturation throughput (concurrent clients) and
added p50 latency at 0 ms upstream. Sequential requests are measured with every core kept
out of idle (``harness.cores_awake``; ``--idle-cores`` to measure without): on a virtual
machine that halts idle vCPUs, waking them costs each request about 1 ms of CPU here, the
same for every target (docs/performance.md). At saturation no core idles; that CPU per
request is the work itself and what sizes the sidecar. Beside them, CPU per full-recount
request (every text new to the proxy, in sync mode) over one raw batched transformers
tokenizer call on the same texts, timed in this process.

The relay, the durable floor and both proxies run on the same event loop
(``--event-loop``, uvloop by default, as the proxy's) and are measured in alternating
blocks, so drift in what else the machine does falls on all alike. Client, fake upstream
and targets share the machine; the upstream serves cached answers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import (
    EVENT_LOOPS,
    Process,
    cores_awake,
    cpu_per_request,
    cpu_seconds,
    minilm_dir,
    pct,
    sequential,
    start_audited_proxy,
    start_relay,
    start_upstream,
    throughput,
)
from bench.workload import request, unique_bodies

# The proxy's durability modes (the first is its default), each with the floor that keeps
# the same promise about the record.
FLOORS = {"sync": "durable", "async": "relay"}
DURABILITIES = tuple(FLOORS)
TARGETS = ("relay", "durable", *DURABILITIES)
FLOOR_NAMES = {"durable": "the durable floor", "relay": "the relay"}


@dataclass(frozen=True)
class Goal:
    """One row of the goal table: ``measure`` of ``mode`` against its floor."""

    mode: str | None  # None: the full recount against the raw tokenizer
    measure: str  # cpu, busy_cpu, saturation, p50, recount
    bound: float

    @property
    def key(self) -> str:
        return f"{self.mode}_{self.measure}" if self.mode else self.measure

    def met(self, value: float) -> bool:
        """Saturation is a floor; CPU, latency and the recount are ceilings."""
        return value >= self.bound if self.measure == "saturation" else value <= self.bound

    @property
    def name(self) -> str:
        if self.mode is None:
            return f"full recount: CPU <= {self.bound:.1f}x one raw batched tokenizer call"
        floor = FLOOR_NAMES[FLOORS[self.mode]]
        what = {
            "cpu": f"CPU per audited request (cache hits) <= {self.bound:.1f}x {floor}",
            "busy_cpu": f"CPU per audited request at saturation <= {self.bound:.1f}x {floor}",
            "saturation": f"saturation throughput >= {self.bound:.2f}x {floor}",
            "p50": f"added p50 over {floor} <= +{self.bound:.1f} ms (0 ms upstream)",
        }[self.measure]
        return f"{self.mode}: {what}"


GOALS = (
    Goal("sync", "cpu", 1.4),
    Goal("sync", "busy_cpu", 1.4),
    Goal("sync", "saturation", 0.65),
    Goal("sync", "p50", 0.4),
    Goal("async", "cpu", 1.6),
    Goal("async", "busy_cpu", 1.6),
    Goal("async", "saturation", 0.55),
    Goal("async", "p50", 0.4),
    Goal(None, "recount", 1.0),
)

Batches = list[list[str]]


@dataclass
class Tally:
    """What the blocks add up to, by target: CPU ms (sequential), latencies, saturation
    requests and the CPU ms they took."""

    cpu: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys((*TARGETS, "recount", "raw"), 0.0)
    )
    lat: dict[str, list[float]] = field(default_factory=lambda: {t: [] for t in TARGETS})
    done: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TARGETS, 0))
    busy_cpu: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TARGETS, 0.0))


def raw_tokenizer(bodies: list[bytes]) -> tuple[Batches, Callable[[Batches], float]]:
    """The texts of each body (query and documents) and a function timing one raw batched
    transformers call per body, in this process, in CPU ms. Parallelism off, as in the
    proxy: the stricter floor (docs/performance.md)."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(minilm_dir()), local_files_only=True)
    texts = [[p["query"], *p["documents"]] for p in map(json.loads, bodies)]
    tok(texts[0], add_special_tokens=True)

    def timed(batches: Batches) -> float:
        started = time.process_time()
        for batch in batches:
            tok(batch, add_special_tokens=True)
        return (time.process_time() - started) * 1000

    return texts, timed


def start_targets(args: argparse.Namespace, workdir: Path) -> tuple[Process, dict[str, Process]]:
    """The fake upstream (ready), and the relay, the durable floor and the proxy in each
    durability mode in front of it (starting), all on ``--event-loop``."""
    upstream = start_upstream(0.0, workdir)
    try:
        upstream.wait_ready("/health", 60)
    except BaseException:
        upstream.stop()
        raise
    loop, extra = args.event_loop, args.proxy_extra.split()
    proxies = {
        mode: start_audited_proxy(
            upstream.url,
            workdir,
            workdir / f"journal-{mode}.sqlite",
            *extra,
            "--durability",
            mode,
            loop=loop,
        )
        for mode in DURABILITIES
    }
    return upstream, {
        "relay": start_relay(upstream.url, workdir, loop=loop),
        "durable": start_relay(upstream.url, workdir, workdir / "relay-journal.sqlite", loop),
        **proxies,
    }


async def alternate(
    args: argparse.Namespace, upstream: Process, targets: dict[str, Process], tally: Tally
) -> None:
    """Cache hits on each target in turn, then new texts on the default proxy and through
    the raw tokenizer, ``--rounds`` times."""
    path, hit = request("rerank 1x64")
    unique = unique_bodies(7, args.recounts)
    texts, raw = raw_tokenizer(unique)
    block, per_round = args.hits // args.rounds, args.recounts // args.rounds
    async with aiohttp.ClientSession() as session:
        for target in targets.values():  # warm each, and the fake's answer cache
            await sequential(session, target.url + path, [hit] * 20)
        await sequential(session, upstream.url + path, unique)
        for r in range(args.rounds):
            for name, target in targets.items():
                spent, values = await cpu_per_request(session, target, path, [hit] * block)
                tally.cpu[name] += spent * block
                tally.lat[name] += values
            chunk = slice(r * per_round, (r + 1) * per_round)
            recounting = targets[DURABILITIES[0]]
            spent, _ = await cpu_per_request(session, recounting, path, unique[chunk])
            tally.cpu["recount"] += spent * per_round
            tally.cpu["raw"] += raw(texts[chunk])


async def saturate(args: argparse.Namespace, targets: dict[str, Process], tally: Tally) -> None:
    """Concurrent clients on each target in turn, ``--rounds`` times."""
    path, hit = request("rerank 1x64")
    for _ in range(args.rounds):
        for name, target in targets.items():
            seconds = args.seconds / args.rounds
            before = cpu_seconds(target.popen.pid)
            tally.done[name] += await throughput(target.url + path, hit, seconds, args.clients)
            tally.busy_cpu[name] += (cpu_seconds(target.popen.pid) - before) * 1000


async def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Floors and proxies measured in alternating blocks (``--rounds``), so drift in what
    else the machine does falls on all alike."""
    upstream, targets = start_targets(args, workdir)
    tally = Tally()
    try:
        for name, target in targets.items():
            target.wait_ready("/readyz" if name in DURABILITIES else "/health", 60)
        with nullcontext() if args.idle_cores else cores_awake():
            await alternate(args, upstream, targets, tally)
        await saturate(args, targets, tally)
    finally:
        for process in (*reversed(targets.values()), upstream):
            process.stop()
    return figures(args, tally)


def figures(args: argparse.Namespace, tally: Tally) -> dict[str, Any]:
    """Per target its CPU ms per request, p50 ms and requests/s; per goal its measured
    value (``GOALS``' keys), from the sums in ``tally``."""
    hits = args.hits // args.rounds * args.rounds
    recounts = args.recounts // args.rounds * args.rounds
    out: dict[str, Any] = {}
    for name in TARGETS:
        out[f"{name}_cpu_ms"] = tally.cpu[name] / hits
        out[f"{name}_p50_ms"] = pct(tally.lat[name], 0.5) * 1000
        out[f"{name}_rps"] = tally.done[name] / args.seconds
        out[f"{name}_busy_cpu_ms"] = ratio(tally.busy_cpu[name], tally.done[name])
    out["recount_cpu_ms"] = tally.cpu["recount"] / recounts
    out["raw_tokenizer_ms"] = tally.cpu["raw"] / recounts
    for mode, floor in FLOORS.items():
        out[f"{mode}_cpu"] = ratio(out[f"{mode}_cpu_ms"], out[f"{floor}_cpu_ms"])
        out[f"{mode}_busy_cpu"] = ratio(out[f"{mode}_busy_cpu_ms"], out[f"{floor}_busy_cpu_ms"])
        out[f"{mode}_saturation"] = ratio(tally.done[mode], tally.done[floor])
        out[f"{mode}_p50"] = out[f"{mode}_p50_ms"] - out[f"{floor}_p50_ms"]
    out["recount"] = ratio(out["recount_cpu_ms"], out["raw_tokenizer_ms"])
    return out


def ratio(a: float, b: float) -> float:
    """a / b; NaN when b is too small to have been measured (CPU clock ticks are 10 ms:
    a smoke run may see none)."""
    return a / b if b else float("nan")


def behind(goal: Goal, r: dict[str, Any]) -> str:
    """The figures a goal's value comes from."""
    if goal.mode is None:
        return f"{r['recount_cpu_ms']:.2f} vs {r['raw_tokenizer_ms']:.2f} CPU ms"
    mode, floor = goal.mode, FLOORS[goal.mode]
    if goal.measure in ("cpu", "busy_cpu"):
        key = f"{goal.measure}_ms"
        return f"{r[f'{mode}_{key}']:.2f} vs {r[f'{floor}_{key}']:.2f} CPU ms/request"
    if goal.measure == "saturation":
        return f"{r[f'{mode}_rps']:.0f} vs {r[f'{floor}_rps']:.0f} requests/s"
    return f"p50 {r[f'{mode}_p50_ms']:.2f} vs {r[f'{floor}_p50_ms']:.2f} ms"


def shown(goal: Goal, value: float) -> str:
    return f"{value:+.2f} ms" if goal.measure == "p50" else f"{value:.2f}x"


def table(r: dict[str, Any]) -> list[str]:
    """The ratios, each with its measured value and the figures behind it; information only
    (issue #42 retired them as goals), so no verdict."""
    out = ["| ratio (retired goal, information) | measured | figures |", "|---|---|---|"]
    for goal in GOALS:
        out.append(f"| {goal.name} | {shown(goal, r[goal.key])} | {behind(goal, r)} |")
    return out


def spread(runs: list[dict[str, Any]]) -> list[str]:
    """Several runs' ratios as ranges; information only, no verdict."""
    out = ["| ratio (retired goal, information) | runs | range |", "|---|---|---|"]
    for goal in GOALS:
        values = [r[goal.key] for r in runs]
        low, high = shown(goal, min(values)), shown(goal, max(values))
        out.append(f"| {goal.name} | {len(values)} | {low} to {high} |")
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="usage-proxy-ratios-") as tmp:
        return asyncio.run(measure(args, Path(tmp)))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hits", type=int, default=600, help="cache-hit requests per target")
    parser.add_argument("--recounts", type=int, default=60, help="all-new-text requests")
    parser.add_argument("--seconds", type=float, default=4.0, help="saturation run length")
    parser.add_argument("--clients", type=int, default=16, help="saturation clients")
    parser.add_argument("--rounds", type=int, default=6, help="alternating blocks per target")
    parser.add_argument("--proxy-extra", default="", help="extra usage-proxy serve options")
    parser.add_argument(
        "--idle-cores",
        action="store_true",
        help="measure sequential requests with the cores free to idle (on a VM that halts "
        "idle vCPUs each request then also pays for waking them)",
    )
    parser.add_argument(
        "--event-loop",
        choices=EVENT_LOOPS,
        default=EVENT_LOOPS[0],
        help="the event loop of the proxy and of both floors",
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the raw figures as JSON")
    parser.add_argument("--runs", type=int, default=1, help="runs, one after another")
    args = parser.parse_args()
    results = []
    for number in range(1, args.runs + 1):
        results.append(run(args))
        if not args.json:
            print(f"run {number} of {args.runs}:", *table(results[-1]), "", sep="\n")
    if args.json:
        print(json.dumps(results if args.runs > 1 else results[0], indent=2))
    elif args.runs > 1:
        print("\n".join(spread(results)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
