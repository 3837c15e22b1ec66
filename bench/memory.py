"""Memory and admission under hostile bodies (issue #11), loopback only, bounded in time.

    python bench/memory.py [--proxy-extra "--max-inflight-body-mib 128"]

Starts a minimal upstream that answers like vLLM to an over-long input (400, after
reading the body) and the real proxy, then measures the proxy's RSS (VmRSS) and peak
(VmHWM, reset between scenarios) for: one body of 2, 8 and 60 MiB of one-character words;
20 concurrent 8 MiB bodies; 10 uploads stalled one byte short; a small rerank sent
while two 3 MiB bodies keep the tokenizer busy; and four concurrent 100 MiB embeddings
answers, with small reranks sent beside them; 40 clients that read none of their 7 MiB
embeddings answers. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import (
    JSON,
    Process,
    free_port,
    minilm_dir,
    port_of,
    start_audited_proxy,
    status_kb,
)

MIB = 1024 * 1024
Row = tuple[str, str]


def reset_peak(pid: int) -> None:
    """Writing 5 to clear_refs resets VmHWM (Linux >= 4.0)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def mb(pid: int, field: str = "VmRSS") -> float:
    return status_kb(pid, field) / 1024


def peak_and_after(pid: int) -> str:
    return f"peak {mb(pid, 'VmHWM'):.0f} MB, after {mb(pid):.0f} MB"


async def upstream_app() -> web.Application:
    async def version(request: web.Request) -> web.Response:
        return web.json_response({"version": "0.29.0"})

    async def models(request: web.Request) -> web.Response:
        entry = {"id": "minilm", "root": str(minilm_dir()), "max_model_len": 256}
        return web.json_response({"object": "list", "data": [entry]})

    async def scoring(request: web.Request) -> web.Response:
        body = await request.read()
        if len(body) > 100_000:
            error = {"message": "too long", "type": "BadRequestError", "param": None, "code": 400}
            return web.json_response({"error": error}, status=400)
        usage = {"prompt_tokens": 25, "total_tokens": 25}
        return web.json_response({"id": "x", "model": "minilm", "usage": usage, "results": []})

    answers = {ANSWER_MIB: big_answer(ANSWER_MIB), STALLED_MIB: big_answer(STALLED_MIB)}

    async def embeddings(request: web.Request) -> web.Response:
        await request.read()
        answer = answers[int(request.query.get("mib", ANSWER_MIB))]
        return web.Response(body=answer, content_type="application/json")

    app = web.Application(client_max_size=1 << 30)
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_get("/version", version)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", version)
    app.router.add_post("/rerank", scoring)
    return app


ANSWER_MIB = 100


def big_answer(mib: int) -> bytes:
    """An embeddings answer of about ``mib`` MiB, as vLLM writes it (usage last)."""
    vector = json.dumps([round(0.001 * i - 0.5, 9) for i in range(1024)])
    item = '{"index":%d,"object":"embedding","embedding":' + vector + "}"
    count = mib * MIB // len(item)
    data = ",".join(item % i for i in range(count))
    usage = f'"usage":{{"prompt_tokens":{count},"total_tokens":{count}}}'
    head = '{"id":"embd-1","object":"list","created":1,"model":"minilm","data":['
    return f"{head}{data}],{usage}}}".encode()


def big_body(mib: int) -> bytes:
    words = "a " * (mib * MIB // 2 - 64)
    return json.dumps({"query": "q", "documents": [words]}).encode()


async def post(session: aiohttp.ClientSession, url: str, body: bytes) -> tuple[int, str]:
    async with session.post(url, data=body, headers=JSON) as r:
        await r.read()
        return r.status, r.headers.get("x-usage-verdict", "-")


def request_head(path: str, length: int) -> bytes:
    """A JSON POST's request line and headers, announcing ``length`` body bytes."""
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


async def stalled_upload(port: int, size: int, hold: float) -> None:
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request_head("/rerank", size))
    chunk = b" " * MIB
    sent = 0
    while sent + MIB < size:
        writer.write(chunk)
        await writer.drain()
        sent += MIB
    await asyncio.sleep(hold)
    writer.close()


STALLED_CLIENTS, STALLED_MIB, SEND_TIMEOUT = 40, 7, 5


async def reads_nothing(port: int, body: bytes) -> tuple[Any, Any]:
    """An embeddings request (a ``STALLED_MIB`` MiB answer) whose client reads nothing."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(request_head(f"/v1/embeddings?mib={STALLED_MIB}", len(body)) + body)
    await writer.drain()
    return reader, writer


SMALL = json.dumps(
    {"query": "What is the capital of France?", "documents": ["Paris.", "Berlin."]}
).encode()
EMBED = json.dumps({"input": ["a"]}).encode()
WARM_UP = json.dumps({"query": "q", "documents": ["d"]}).encode()


async def one_body(session: aiohttp.ClientSession, proxy: Process) -> list[Row]:
    """One body at a time, of each size."""
    rows = []
    for mib in (2, 8, 60):
        reset_peak(proxy.popen.pid)
        started = time.monotonic()
        status, _ = await post(session, proxy.url + "/rerank", big_body(mib))
        took = time.monotonic() - started
        await asyncio.sleep(1)
        detail = f"status {status}, {took:.1f} s, {peak_and_after(proxy.popen.pid)}"
        rows.append((f"one {mib} MiB body", detail))
    return rows


async def concurrent_bodies(session: aiohttp.ClientSession, proxy: Process) -> list[Row]:
    """Twenty bodies at once: what admission lets the proxy hold together."""
    reset_peak(proxy.popen.pid)
    body = big_body(8)
    started = time.monotonic()
    url = proxy.url + "/rerank"
    statuses = await asyncio.gather(*(post(session, url, body) for _ in range(20)))
    took = time.monotonic() - started
    await asyncio.sleep(2)
    codes = sorted({s for s, _ in statuses})
    detail = f"statuses {codes}, {took:.1f} s, {peak_and_after(proxy.popen.pid)}"
    return [("20 concurrent 8 MiB bodies", detail)]


async def stalled_uploads(session: aiohttp.ClientSession, proxy: Process) -> list[Row]:
    """Uploads that never finish: what their buffered bytes cost while they are held."""
    reset_peak(proxy.popen.pid)
    port = port_of(proxy.url)
    await asyncio.gather(*(stalled_upload(port, 60 * MIB, 40) for _ in range(10)))
    await asyncio.sleep(2)
    name = "10 uploads of 60 MiB stalled 1 MiB short, held 40 s"
    return [(name, peak_and_after(proxy.popen.pid))]


async def beside_tokenizer(session: aiohttp.ClientSession, proxy: Process) -> list[Row]:
    """A small rerank while two large bodies keep the tokenizer busy: counted in time?"""
    url = proxy.url + "/rerank"
    neighbours = [asyncio.create_task(post(session, url, big_body(3))) for _ in range(2)]
    await asyncio.sleep(0.3)
    started = time.monotonic()
    _, verdict = await post(session, url, SMALL)
    took = time.monotonic() - started
    await asyncio.gather(*neighbours)
    counted = "counted in time" if verdict != "unaudited" else "NOT counted in time"
    return [("small rerank beside two 3 MiB bodies", f"{counted}, {took * 1000:.0f} ms")]


async def big_answers(session: aiohttp.ClientSession, proxy: Process) -> list[Row]:
    """Large embeddings answers at once, and how slow small reranks get beside them."""
    pid = proxy.popen.pid
    reset_peak(pid)
    started = time.monotonic()
    embed = proxy.url + "/v1/embeddings"
    answers = [asyncio.create_task(post(session, embed, EMBED)) for _ in range(4)]
    await asyncio.sleep(0.2)
    beside = []
    while not all(a.done() for a in answers):
        began = time.monotonic()
        await post(session, proxy.url + "/rerank", SMALL)
        beside.append(time.monotonic() - began)
    took = time.monotonic() - started
    statuses = sorted({s for s, _ in await asyncio.gather(*answers)})
    await asyncio.sleep(1)
    detail = (
        f"statuses {statuses}, {took:.1f} s, {peak_and_after(pid)}; small reranks beside "
        f"them: slowest {max(beside, default=0) * 1000:.0f} ms of {len(beside)}"
    )
    return [(f"4 concurrent {ANSWER_MIB} MiB embeddings answers", detail)]


async def unread_answers(session: aiohttp.ClientSession, proxy: Process) -> list[Row]:
    """Clients that read nothing, held until ``--send-timeout`` cuts them."""
    pid = proxy.popen.pid
    reset_peak(pid)
    port = port_of(proxy.url)
    stalled = [await reads_nothing(port, EMBED) for _ in range(STALLED_CLIENTS)]
    await asyncio.sleep(3)
    during = mb(pid)
    await asyncio.sleep(SEND_TIMEOUT + 2)
    for _, writer in stalled:
        writer.close()
    name = (
        f"{STALLED_CLIENTS} clients reading none of their {STALLED_MIB} MiB "
        f"embeddings answers (--send-timeout {SEND_TIMEOUT})"
    )
    detail = (
        f"RSS {during:.0f} MB while they wait, peak {mb(pid, 'VmHWM'):.0f} MB, "
        f"{mb(pid):.0f} MB once they are cut"
    )
    return [(name, detail)]


# Run in this order, on one proxy: each row's "after" is where the next one starts.
SCENARIOS = (
    one_body,
    concurrent_bodies,
    stalled_uploads,
    beside_tokenizer,
    big_answers,
    unread_answers,
)


async def run(args: argparse.Namespace, workdir: Path) -> list[Row]:
    runner = web.AppRunner(await upstream_app())
    await runner.setup()
    up_port = free_port()
    await web.TCPSite(runner, "127.0.0.1", up_port).start()
    extra = ("--send-timeout", str(SEND_TIMEOUT), *args.proxy_extra.split())
    upstream = f"http://127.0.0.1:{up_port}"
    proxy = start_audited_proxy(upstream, workdir, workdir / "j.sqlite", *extra)
    await asyncio.to_thread(proxy.wait_ready, "/readyz", 60)
    pid = proxy.popen.pid
    rows: list[Row] = []
    timeout = aiohttp.ClientTimeout(total=300)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            await post(session, proxy.url + "/rerank", WARM_UP)
            idle = mb(pid)
            rows.append(("idle", f"RSS {idle:.0f} MB"))
            for scenario in SCENARIOS:
                rows += await scenario(session, proxy)
            rows.append(("after everything", f"RSS {mb(pid):.0f} MB (idle was {idle:.0f})"))
    finally:
        proxy.stop()
        await runner.cleanup()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proxy-extra", default="", help="extra usage-proxy serve options")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="usage-proxy-memory-") as tmp:
        rows = asyncio.run(run(args, Path(tmp)))
    print("| scenario | result |\n|---|---|")
    for name, result in rows:
        print(f"| {name} | {result} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
