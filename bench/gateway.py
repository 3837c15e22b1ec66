"""The proxy against LiteLLM's proxy on the same fake upstream (issue #42).

    python bench/gateway.py          # prints the table

LiteLLM is what an operator would otherwise put in front of vLLM; it audits nothing, and
writes its spend logs after the answer, so the proxy it is judged against runs in
``--durability async`` (issue #51), whose records are committed off the answer's path
too. It comes from pyproject's ``bench`` extra, which only ``make bench`` installs (never
1.107.0, the compromised release); without it the comparison is skipped.
It runs with a master key generated for the run (never a default), the fake's models as
``hosted_vllm`` deployments, offline (its bundled cost map). Per workload, sequential
requests, cores kept awake, every target in turn in ``ROUNDS`` alternating blocks (so
drift in the machine's load falls on all alike): CPU per request (/proc, the process that
listens on the port) and p50 of the bare relay, the durable relay (one fsync'd commit per
request before it answers), the proxy in ``--durability async`` and in ``sync`` (the
default), and LiteLLM; each one's added p50 over the relay. The sync proxy's p50 is
information, with the share of it that waiting for the fsync'd commit takes (its p50 less
the async proxy's).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import (
    JSON,
    Process,
    _spawn,
    cores_awake,
    cpu_seconds,
    exit_on_sigterm,
    free_port,
    listening_pid,
    pct,
    port_of,
    start_audited_proxy,
    start_relay,
    start_upstream,
)
from bench.workload import QUERY, doc

GOAL = 0.1  # the async proxy's added p50 over the relay <= this times LiteLLM's
ROUNDS = 4
MODEL = "minilm"
# The same requests for every target; LiteLLM needs the model named and serves rerank on
# /v1/rerank, which the fake (as vLLM) also serves.
WORKLOADS = {
    "embeddings x1": ("/v1/embeddings", {"model": MODEL, "input": "hello world"}),
    "rerank 1x64": (
        "/v1/rerank",
        {"model": MODEL, "query": QUERY, "documents": [doc(i) for i in range(64)]},
    ),
}


def litellm_command() -> str | None:
    """The ``litellm`` CLI beside this Python (the bench extra), or None."""
    here = Path(sys.executable).parent / "litellm"
    return str(here) if here.exists() else shutil.which("litellm")


def start_litellm(upstream: str, workdir: Path, key: str) -> Process | None:
    """LiteLLM's proxy in front of ``upstream`` with master key ``key``; None when the
    bench extra is not installed."""
    command = litellm_command()
    if command is None:
        return None
    config = workdir / "litellm.yaml"
    params = {"model": f"hosted_vllm/{MODEL}", "api_base": f"{upstream}/v1", "api_key": "none"}
    config.write_text(
        json.dumps(  # YAML is a superset of JSON
            {
                "model_list": [{"model_name": MODEL, "litellm_params": params}],
                "general_settings": {"master_key": key},
                "litellm_settings": {"telemetry": False, "drop_params": True},
            }
        )
    )
    port = free_port()
    argv = [command, "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
    env = {
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch of the cost map at start-up
        "LITELLM_LOG": "ERROR",
        "LITELLM_TELEMETRY": "False",
        "DISABLE_SCHEMA_UPDATE": "true",
    }
    return _spawn("litellm", argv, env, workdir / "litellm.log", port)


async def warm(
    session: aiohttp.ClientSession, target: Process, path: str, body: bytes, key: str
) -> None:
    """Five requests, each answered 200, before anything is measured."""
    headers = {**JSON, "Authorization": f"Bearer {key}"}
    for _ in range(5):
        async with session.post(target.url + path, data=body, headers=headers) as r:
            if r.status != 200:
                raise RuntimeError(f"{target.name} {path}: HTTP {r.status}: {await r.text()}")
            await r.read()


async def block(
    session: aiohttp.ClientSession, target: Process, path: str, body: bytes, n: int, key: str
) -> tuple[float, list[float]]:
    """CPU seconds of the process listening on ``target``'s port over ``n`` sequential
    requests, and each request's seconds."""
    headers = {**JSON, "Authorization": f"Bearer {key}"}
    url = target.url + path
    pid = listening_pid(target.popen.pid, port_of(target.url))
    values = []
    before = cpu_seconds(pid)
    for _ in range(n):
        started = asyncio.get_running_loop().time()
        async with session.post(url, data=body, headers=headers) as r:
            await r.read()
        values.append(asyncio.get_running_loop().time() - started)
    return cpu_seconds(pid) - before, values


async def measure(
    session: aiohttp.ClientSession,
    targets: dict[str, Process],
    path: str,
    body: bytes,
    n: int,
    key: str,
) -> dict[str, dict[str, float]]:
    """Per target, CPU ms per request and p50 ms over ``n`` requests sent in ``ROUNDS``
    blocks, the targets taking turns."""
    for target in targets.values():
        await warm(session, target, path, body, key)
    spent = dict.fromkeys(targets, 0.0)
    values: dict[str, list[float]] = {name: [] for name in targets}
    for r in range(ROUNDS):
        count = (r + 1) * n // ROUNDS - r * n // ROUNDS
        for name, target in targets.items():
            seconds, times = await block(session, target, path, body, count, key)
            spent[name] += seconds
            values[name] += times
    return {
        name: {"cpu_ms": spent[name] / n * 1000, "p50_ms": pct(values[name], 0.5) * 1000}
        for name in targets
    }


async def compare(targets: dict[str, Process], key: str, n: int) -> list[dict[str, Any]]:
    rows = []
    async with aiohttp.ClientSession() as session:
        for workload, (path, payload) in WORKLOADS.items():
            body = json.dumps(payload).encode()
            with cores_awake():
                figures = await measure(session, targets, path, body, n, key)
            row: dict[str, Any] = {"workload": workload, **figures}
            if "litellm" in figures:
                relay = figures["relay"]["p50_ms"]
                proxy_added = figures["proxy"]["p50_ms"] - relay
                litellm_added = figures["litellm"]["p50_ms"] - relay
                row["ratio"] = proxy_added / litellm_added if litellm_added > 0 else float("nan")
            rows.append(row)
    return rows


def run(n: int = 200) -> dict[str, Any]:
    """Start the fake upstream, the relays, both proxies and LiteLLM; compare; stop them."""
    key = "sk-" + secrets.token_urlsafe(24)  # generated for this run, never a default
    with tempfile.TemporaryDirectory(prefix="usage-proxy-gateway-") as tmp:
        workdir = Path(tmp)
        upstream = start_upstream(0.0, workdir)
        targets: dict[str, Process] = {}
        try:
            upstream.wait_ready("/health", 60)
            targets["relay"] = start_relay(upstream.url, workdir)
            targets["durable"] = start_relay(upstream.url, workdir, workdir / "relay.sqlite")
            targets["proxy"] = start_audited_proxy(
                upstream.url, workdir, workdir / "async.sqlite", "--durability", "async"
            )
            targets["proxy_sync"] = start_audited_proxy(
                upstream.url, workdir, workdir / "sync.sqlite", "--durability", "sync"
            )
            litellm = start_litellm(upstream.url, workdir, key)
            if litellm is not None:
                targets["litellm"] = litellm
            for name, target in targets.items():
                path = "/health/liveliness" if name == "litellm" else "/health"
                target.wait_ready("/readyz" if name.startswith("proxy") else path, 180)
            rows = asyncio.run(compare(targets, key, n))
        finally:
            for target in targets.values():
                target.stop()
            upstream.stop()
    result: dict[str, Any] = {"rows": rows}
    if "litellm" not in targets:
        result["skipped"] = "LiteLLM is not installed (pyproject's bench extra; make bench)"
    return result


def table(result: dict[str, Any]) -> list[str]:
    """CPU per request and p50 of each target, per workload, and the goal's verdict (the
    async proxy's added p50 against LiteLLM's); then the sync proxy's, as information,
    with the share of it that waiting for the commit takes."""
    out = [
        "| workload | relay CPU ms / p50 ms | proxy (async) CPU ms / p50 ms | LiteLLM CPU ms / "
        f"p50 ms | proxy's added p50 / LiteLLM's (over the relay) | met (<= {GOAL}x) |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        ratio = r.get("ratio")
        shown = f"{ratio:.2f}x" if ratio is not None else "not measured"
        met = ("yes" if ratio <= GOAL else "no") if ratio is not None else "not measured"
        cells = " | ".join(cell(r, name) for name in ("relay", "proxy", "litellm"))
        out.append(f"| {r['workload']} | {cells} | {shown} | {met} |")
    if "skipped" in result:
        out.append("")
        out.append(f"LiteLLM not measured: {result['skipped']}.")
    return out + durable_table(result)


def cell(row: dict[str, Any], name: str) -> str:
    f = row.get(name)
    return f"{f['cpu_ms']:.2f} / {f['p50_ms']:.2f}" if f else "not measured"


def durable_table(result: dict[str, Any]) -> list[str]:
    """Information, no goal: the sync proxy and the durable relay beside the relay, and
    what the fsync'd commit adds to the proxy's p50 (sync less async)."""
    rows = [r for r in result["rows"] if "proxy_sync" in r and "durable" in r]
    if not rows:
        return []
    out = [
        "",
        "Information, no goal: `--durability sync` (the default: the record is on disk before "
        "the answer leaves) on the same requests, in the same blocks.",
        "",
        "| workload | durable relay CPU ms / p50 ms | proxy (sync) CPU ms / p50 ms | sync "
        "proxy's added p50 over the relay | of which the commit (sync less async p50) | "
        "durable relay's added p50 |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        relay, late = r["relay"]["p50_ms"], r["proxy"]["p50_ms"]
        sync, durable = r["proxy_sync"]["p50_ms"], r["durable"]["p50_ms"]
        out.append(
            f"| {r['workload']} | {cell(r, 'durable')} | {cell(r, 'proxy_sync')} | "
            f"{sync - relay:+.2f} ms | {sync - late:+.2f} ms | {durable - relay:+.2f} ms |"
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200, help="per target and workload")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    exit_on_sigterm()
    result = run(args.requests)
    print(json.dumps(result, indent=2) if args.json else "\n".join(table(result)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
