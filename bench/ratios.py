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
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.run import (  # noqa: E402
    SCENARIOS,
    cpu_seconds,
    pct,
    sequential,
    start_relay,
    start_upstream,
    throughput,
    unique_bodies,
)
from scripts.vllm_cpu import Process, minilm_dir, start_proxy  # noqa: E402

GOALS = {
    "hit_cpu_ratio": ("CPU per audited request (cache hits) <= 2.0x the relay", 2.0, "<="),
    "saturation_ratio": ("saturation throughput >= 0.5x the relay", 0.5, ">="),
    "recount_ratio": ("CPU per full-recount request <= 1.0x raw batched tokenizer", 1.0, "<="),
    "added_p50_ms": ("added p50 over the relay <= 0.5 ms (0 ms upstream)", 0.5, "<="),
}


async def cpu_per_request(
    session: aiohttp.ClientSession, target: Process, path: str, bodies: list[bytes]
) -> tuple[float, list[float]]:
    """(CPU ms per request, latencies) for ``bodies`` sent sequentially to ``target``."""
    pid = target.popen.pid
    before = cpu_seconds(pid)
    values = await sequential(session, target.url + path, bodies)
    return (cpu_seconds(pid) - before) / len(bodies) * 1000, values


def raw_tokenizer(bodies: list[bytes]) -> Any:
    """A function timing one raw batched transformers call per body (query and documents),
    in this process; returns CPU ms per call. Parallelism off, as in the proxy (the
    stricter floor: with rayon's threads the same call costs about 1.6x the CPU)."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(minilm_dir()), local_files_only=True)
    texts = [[p["query"], *p["documents"]] for p in map(json.loads, bodies)]
    tok(texts[0], add_special_tokens=True)

    def timed(batches: list[list[str]]) -> float:
        started = time.process_time()
        for batch in batches:
            tok(batch, add_special_tokens=True)
        return (time.process_time() - started) * 1000

    return texts, timed


async def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Relay and proxy measured in alternating blocks (``--rounds``), so drift in what
    else the machine does falls on both alike."""
    path, payload = SCENARIOS["rerank 1x64"]
    hit = json.dumps(payload).encode()
    upstream = start_upstream(0.0, workdir)
    upstream.wait_ready("/health", 60)
    relay = start_relay(upstream.url, workdir)
    durable = start_relay(upstream.url, workdir, workdir / "relay-journal.sqlite")
    proxy = start_proxy(
        upstream.url,
        workdir,
        "--journal",
        str(workdir / "journal.sqlite"),
        "--log-level",
        "warning",
        *args.proxy_extra.split(),
    )
    targets = (("relay", relay), ("durable", durable), ("proxy", proxy))
    cpu = {"relay": 0.0, "durable": 0.0, "proxy": 0.0, "recount": 0.0, "raw": 0.0}
    lat: dict[str, list[float]] = {"relay": [], "durable": [], "proxy": []}
    done = {"relay": 0, "durable": 0, "proxy": 0}
    try:
        relay.wait_ready("/health", 60)
        durable.wait_ready("/health", 60)
        proxy.wait_ready("/readyz", 60)
        unique = unique_bodies(7, args.recounts)
        texts, raw = raw_tokenizer(unique)
        block, per_round = args.hits // args.rounds, args.recounts // args.rounds
        async with aiohttp.ClientSession() as session:
            for _, target in targets:  # warm each, and the fake's answer cache
                await sequential(session, target.url + path, [hit] * 20)
            await sequential(session, upstream.url + path, unique)
            for r in range(args.rounds):
                for name, target in targets:
                    spent, values = await cpu_per_request(session, target, path, [hit] * block)
                    cpu[name] += spent * block
                    lat[name] += values
                chunk = slice(r * per_round, (r + 1) * per_round)
                spent, _ = await cpu_per_request(session, proxy, path, unique[chunk])
                cpu["recount"] += spent * per_round
                cpu["raw"] += raw(texts[chunk])
        for _ in range(args.rounds):
            for name, target in targets:
                seconds = args.seconds / args.rounds
                done[name] += await throughput(target.url + path, hit, seconds, args.clients)
    finally:
        for p in (proxy, durable, relay, upstream):
            p.stop()
    hits, recounts = block * args.rounds, per_round * args.rounds
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
