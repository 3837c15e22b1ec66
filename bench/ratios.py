"""The proxy's cost as ratios to its floors, measured in one run (issue #14's goals).

    python bench/ratios.py             # prints the table
    python bench/ratios.py --json      # machine-readable

- CPU per audited request with count-cache hits, over the minimal aiohttp relay's CPU for
  the same requests (whole-process CPU from /proc, sequential requests);
- saturation throughput (concurrent clients), proxy over relay;
- CPU per full-recount request (every text new to the proxy) over one raw batched
  transformers tokenizer call on the same texts, timed in this process;
- added p50 latency of the proxy over the relay at 0 ms upstream.

The same three relay figures are also taken against the relay with a durable ledger
(bench/minimal_relay.py JOURNAL: one fsync'd SQLite commit per request, group commit,
before the answer is released): not the issue's floor, the floor of any proxy that
promises ``--durability sync``, reported beside the goals.

The relay, the durable relay and the proxy run on the same event loop (``--event-loop``,
uvloop by default, as the proxy's): each ratio is same-loop.

Client, fake upstream and targets share the machine; the upstream serves cached answers.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import (
    EVENT_LOOPS,
    Process,
    cpu_per_request,
    minilm_dir,
    pct,
    sequential,
    start_audited_proxy,
    start_relay,
    start_upstream,
    throughput,
)
from bench.workload import request, unique_bodies

GOALS = {
    "hit_cpu_ratio": ("CPU per audited request (cache hits) <= 2.0x the relay", 2.0, "<="),
    "saturation_ratio": ("saturation throughput >= 0.5x the relay", 0.5, ">="),
    "recount_ratio": ("CPU per full-recount request <= 1.0x raw batched tokenizer", 1.0, "<="),
    "added_p50_ms": ("added p50 over the relay <= 0.5 ms (0 ms upstream)", 0.5, "<="),
}

# The proxy's durability modes, each measured in a run of its own; the first is its default.
DURABILITIES = ("sync", "async")

Batches = list[list[str]]


@dataclass
class Tally:
    """What the blocks add up to, by target: CPU ms, latencies, saturation requests."""

    cpu: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(("relay", "durable", "proxy", "recount", "raw"), 0.0)
    )
    lat: dict[str, list[float]] = field(
        default_factory=lambda: {"relay": [], "durable": [], "proxy": []}
    )
    done: dict[str, int] = field(default_factory=lambda: {"relay": 0, "durable": 0, "proxy": 0})


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
    """The fake upstream (ready), and the relay, the relay with a durable ledger and the
    proxy in front of it (starting), all three on ``--event-loop``."""
    upstream = start_upstream(0.0, workdir)
    try:
        upstream.wait_ready("/health", 60)
    except BaseException:
        upstream.stop()
        raise
    journal, loop = workdir / "journal.sqlite", args.event_loop
    return upstream, {
        "relay": start_relay(upstream.url, workdir, loop=loop),
        "durable": start_relay(upstream.url, workdir, workdir / "relay-journal.sqlite", loop),
        "proxy": start_audited_proxy(
            upstream.url, workdir, journal, *args.proxy_extra.split(), loop=loop
        ),
    }


async def alternate(
    args: argparse.Namespace, upstream: Process, targets: dict[str, Process], tally: Tally
) -> None:
    """Cache hits on each target in turn, then new texts on the proxy and through the raw
    tokenizer, ``--rounds`` times."""
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
            spent, _ = await cpu_per_request(session, targets["proxy"], path, unique[chunk])
            tally.cpu["recount"] += spent * per_round
            tally.cpu["raw"] += raw(texts[chunk])


async def saturate(args: argparse.Namespace, targets: dict[str, Process], tally: Tally) -> None:
    """Concurrent clients on each target in turn, ``--rounds`` times."""
    path, hit = request("rerank 1x64")
    for _ in range(args.rounds):
        for name, target in targets.items():
            seconds = args.seconds / args.rounds
            tally.done[name] += await throughput(target.url + path, hit, seconds, args.clients)


async def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Relay and proxy measured in alternating blocks (``--rounds``), so drift in what
    else the machine does falls on both alike."""
    upstream, targets = start_targets(args, workdir)
    tally = Tally()
    try:
        for name, target in targets.items():
            target.wait_ready("/readyz" if name == "proxy" else "/health", 60)
        await alternate(args, upstream, targets, tally)
        await saturate(args, targets, tally)
    finally:
        for process in (*reversed(targets.values()), upstream):
            process.stop()
    return figures(args, tally)


def figures(args: argparse.Namespace, tally: Tally) -> dict[str, Any]:
    """The per-request figures and their ratios, from the sums in ``tally``."""
    cpu, lat, done = tally.cpu, tally.lat, tally.done
    hits = args.hits // args.rounds * args.rounds
    recounts = args.recounts // args.rounds * args.rounds
    relay_cpu, proxy_cpu = cpu["relay"] / hits, cpu["proxy"] / hits
    recount_cpu, raw_ms = cpu["recount"] / recounts, cpu["raw"] / recounts
    relay_p50, proxy_p50 = pct(lat["relay"], 0.5) * 1000, pct(lat["proxy"], 0.5) * 1000
    durable_cpu, durable_p50 = cpu["durable"] / hits, pct(lat["durable"], 0.5) * 1000
    return {
        "relay_cpu_ms": relay_cpu,
        "proxy_cpu_ms": proxy_cpu,
        "hit_cpu_ratio": ratio(proxy_cpu, relay_cpu),
        "relay_rps": done["relay"] / args.seconds,
        "proxy_rps": done["proxy"] / args.seconds,
        "saturation_ratio": ratio(done["proxy"], done["relay"]),
        "recount_cpu_ms": recount_cpu,
        "raw_tokenizer_ms": raw_ms,
        "recount_ratio": ratio(recount_cpu, raw_ms),
        "relay_p50_ms": relay_p50,
        "proxy_p50_ms": proxy_p50,
        "added_p50_ms": proxy_p50 - relay_p50,
        "durable_relay_cpu_ms": durable_cpu,
        "durable_hit_cpu_ratio": ratio(proxy_cpu, durable_cpu),
        "durable_relay_rps": done["durable"] / args.seconds,
        "durable_saturation_ratio": ratio(done["proxy"], done["durable"]),
        "durable_relay_p50_ms": durable_p50,
        "durable_added_p50_ms": proxy_p50 - durable_p50,
    }


def ratio(a: float, b: float) -> float:
    """a / b; NaN when b is too small to have been measured (CPU clock ticks are 10 ms:
    a smoke run may see none)."""
    return a / b if b else float("nan")


def table(r: dict[str, Any]) -> list[str]:
    """The goals, each with its measured ratio and the figures behind it."""
    behind = {
        "hit_cpu_ratio": f"{r['proxy_cpu_ms']:.2f} vs {r['relay_cpu_ms']:.2f} CPU ms/request",
        "saturation_ratio": f"{r['proxy_rps']:.0f} vs {r['relay_rps']:.0f} requests/s",
        "recount_ratio": f"{r['recount_cpu_ms']:.2f} vs {r['raw_tokenizer_ms']:.2f} CPU ms",
        "added_p50_ms": f"p50 {r['proxy_p50_ms']:.2f} vs {r['relay_p50_ms']:.2f} ms",
    }
    out = ["| goal | measured | figures | met |", "|---|---|---|---|"]
    for key, (name, bound, sense) in GOALS.items():
        value = r[key]
        met = value <= bound if sense == "<=" else value >= bound
        shown = f"{value:+.2f} ms" if key == "added_p50_ms" else f"{value:.2f}x"
        out.append(f"| {name} | {shown} | {behind[key]} | {'yes' if met else 'no'} |")
    return out


def durable_table(r: dict[str, Any]) -> list[str]:
    """The same figures against the relay with a durable ledger (not the issue's goals)."""
    return [
        "| against the relay with an fsync'd ledger | measured | figures |",
        "|---|---|---|",
        f"| CPU per audited request (cache hits) | {r['durable_hit_cpu_ratio']:.2f}x | "
        f"{r['proxy_cpu_ms']:.2f} vs {r['durable_relay_cpu_ms']:.2f} CPU ms/request |",
        f"| saturation throughput | {r['durable_saturation_ratio']:.2f}x | "
        f"{r['proxy_rps']:.0f} vs {r['durable_relay_rps']:.0f} requests/s |",
        f"| added p50 (0 ms upstream) | {r['durable_added_p50_ms']:+.2f} ms | "
        f"p50 {r['proxy_p50_ms']:.2f} vs {r['durable_relay_p50_ms']:.2f} ms |",
    ]


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
        "--event-loop",
        choices=EVENT_LOOPS,
        default=EVENT_LOOPS[0],
        help="the event loop of the proxy and of both floors",
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the raw figures as JSON")
    args = parser.parse_args()
    result = run(args)
    shown = [*table(result), "", *durable_table(result)]
    print(json.dumps(result, indent=2) if args.json else "\n".join(shown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
