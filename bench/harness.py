"""The benchmarks' shared harness: the processes under test, the load, and what is read
from /proc about them."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.vllm_cpu import Process, _spawn, free_port, minilm_dir, start_proxy  # noqa: E402

JSON = {"Content-Type": "application/json"}

# The event loops a target can run on (the proxy's --event-loop; the relay reads the same
# variable), the proxy's default first. The fake upstream and the client stay on asyncio's.
EVENT_LOOPS = ("uvloop", "asyncio")
LOOP_ENV = "USAGE_PROXY_EVENT_LOOP"


# A busy loop in the idle scheduling class: it runs only on a core nothing else wants.
SPINNER = """import os
os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
while True:
    pass
"""


@contextmanager
def cores_awake() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Keep every core out of idle while sequential requests are measured.

    A virtual machine that halts an idle vCPU (this one: the haltpoll cpuidle driver with
    guest_halt_poll_ns 0) makes each sequential request pay for waking the cores it
    crosses: here about 1 ms of CPU and 2 ms of latency per request, the same for every
    target, which measures the hypervisor rather than the target and squeezes every ratio
    towards 1. One ``SCHED_IDLE`` spinner per core takes a core only when nothing else
    would run on it (docs/performance.md)."""
    spinners = [
        subprocess.Popen([sys.executable, "-c", SPINNER], stdin=subprocess.DEVNULL)
        for _ in range(os.cpu_count() or 1)
    ]
    try:
        yield spinners
    finally:
        for spinner in spinners:
            spinner.kill()
        for spinner in spinners:
            spinner.wait()


class Terminated(SystemExit):
    """SIGTERM, raised where the bench is, so that every ``finally`` on the way out runs
    (the servers it started are stopped, the server slot given back)."""


def exit_on_sigterm() -> None:
    """SIGTERM ends the bench as Ctrl-C does, once: a second one while it stops its
    servers is ignored, so that stopping them is not cut short."""

    def terminate(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated(128 + signum)

    signal.signal(signal.SIGTERM, terminate)


def start_upstream(latency_ms: float, workdir: Path) -> Process:
    """The fast fake vLLM (bench/upstream.py) with ``latency_ms`` added to each answer."""
    port = free_port()
    argv = [
        sys.executable,
        str(ROOT / "bench" / "upstream.py"),
        str(port),
        str(latency_ms),
        str(minilm_dir()),
    ]
    log = workdir / f"upstream-{latency_ms:g}-{port}.log"
    return _spawn("upstream", argv, {"HF_HUB_OFFLINE": "1"}, log, port)


def start_relay(
    upstream: str, workdir: Path, journal: Path | None = None, loop: str = EVENT_LOOPS[0]
) -> Process:
    """The minimal aiohttp relay (bench/minimal_relay.py) in front of ``upstream`` on the
    event loop ``loop``; with ``journal``, committing one row per request to it (fsync'd)
    before answering."""
    port = free_port()
    argv = [sys.executable, str(ROOT / "bench" / "minimal_relay.py"), upstream, str(port)]
    name = "relay" if journal is None else "durable-relay"
    argv += [str(journal)] if journal else []
    return _spawn(name, argv, {LOOP_ENV: loop}, workdir / f"{name}-{port}.log", port)


def start_audited_proxy(
    upstream: str, workdir: Path, journal: Path, *extra: str, loop: str = EVENT_LOOPS[0]
) -> Process:
    """The real proxy (``usage-proxy serve``) journaling to ``journal``, on the event loop
    ``loop``; warnings only, so that writing logs is not part of what is measured. The
    pass-through scenario's echo route is the fake's own (vLLM has none): relayed by the
    operator's opt-in."""
    return start_proxy(
        upstream,
        workdir,
        "--journal",
        str(journal),
        "--log-level",
        "warning",
        "--allow-unmetered",
        "/echo*",
        "--event-loop",
        loop,
        *extra,
    )


def start_nginx(upstream_port: int, workdir: Path) -> Process | None:
    """nginx as a reverse proxy in front of ``upstream_port``; None if it is not installed."""
    if shutil.which("nginx") is None:
        return None
    port = free_port()
    conf = workdir / f"nginx-{port}.conf"
    conf.write_text(f"""
worker_processes 1; daemon off; pid {workdir}/nginx-{port}.pid; error_log stderr warn;
events {{ worker_connections 1024; }}
http {{
  access_log off; client_max_body_size 64m; client_body_buffer_size 64m;
  client_body_temp_path {workdir}/cb; proxy_temp_path {workdir}/pt;
  fastcgi_temp_path {workdir}/ft; uwsgi_temp_path {workdir}/ut; scgi_temp_path {workdir}/st;
  upstream up {{ server 127.0.0.1:{upstream_port}; keepalive 64; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{ proxy_pass http://up; proxy_http_version 1.1;
                 proxy_set_header Connection ""; proxy_buffering off; }}
  }}
}}""")
    return _spawn("nginx", ["nginx", "-c", str(conf)], {}, workdir / "nginx.log", port)


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


async def sequential(session: aiohttp.ClientSession, url: str, bodies: list[bytes]) -> list[float]:
    """Seconds per request, one at a time."""
    out = []
    for body in bodies:
        started = time.perf_counter()
        async with session.post(url, data=body, headers=JSON) as r:
            await r.read()
            if r.status != 200:
                raise RuntimeError(f"{url}: HTTP {r.status}: {(await r.text())[:200]}")
        out.append(time.perf_counter() - started)
    return out


async def latency(
    session: aiohttp.ClientSession, url: str, bodies: list[bytes], n: int
) -> list[float]:
    """Sequential requests (cycling through ``bodies``); seconds each, after two warm-ups."""
    cycled = [bodies[i % len(bodies)] for i in range(n + 2)]
    return (await sequential(session, url, cycled))[2:]


async def throughput(url: str, body: bytes, seconds: float, clients: int) -> int:
    """Requests completed by ``clients`` concurrent loops in ``seconds``."""
    done = 0
    deadline = time.perf_counter() + seconds
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def loop() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                async with session.post(url, data=body, headers=JSON) as r:
                    await r.read()
                    done += 1

        await asyncio.gather(*(loop() for _ in range(clients)))
    return done


async def sse(session: aiohttp.ClientSession, url: str, n: int) -> tuple[list[float], list[float]]:
    """Time to first byte and gaps between chunks of a streamed chat completion."""
    ttfb, gaps = [], []
    body = json.dumps({"model": "minilm", "stream": True, "messages": []}).encode()
    for _ in range(n):
        started = time.perf_counter()
        async with session.post(url + "/v1/chat/completions", data=body, headers=JSON) as r:
            last = None
            async for _chunk in r.content.iter_any():
                now = time.perf_counter()
                if last is None:
                    ttfb.append(now - started)
                else:
                    gaps.append(now - last)
                last = now
    return ttfb, gaps


def cpu_seconds(pid: int) -> float:
    """User + system CPU of the whole process (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def cpu_per_request(
    session: aiohttp.ClientSession, target: Process, path: str, bodies: list[bytes]
) -> tuple[float, list[float]]:
    """(CPU ms per request, latencies) for ``bodies`` sent sequentially to ``target``."""
    pid = target.popen.pid
    before = cpu_seconds(pid)
    values = await sequential(session, target.url + path, bodies)
    return (cpu_seconds(pid) - before) / len(bodies) * 1000, values


def listening_pid(root: int, port: int) -> int:
    """The process, ``root`` or one of its descendants, that listens on ``port``: vLLM's
    API server (the engine core it spawns holds no listening socket)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # LISTEN
                inodes.add(fields[9])
    for pid in (root, *descendants(root)):
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:[") and target[8:-1] in inodes:
                    return pid
        except OSError:
            continue
    raise RuntimeError(f"no process under {root} listens on port {port}")


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, from /proc/PID/task/*/children."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in map(int, (task / "children").read_text().split()):
            out += [child, *descendants(child)]
    return out


def status_kb(pid: int, field: str) -> float:
    """A kB figure of /proc/PID/status (VmRSS, VmHWM, ...); 0 if the kernel lacks it."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return float(line.split()[1])
    return 0.0


def rss_mb(pid: int) -> float:
    return status_kb(pid, "VmRSS") / 1024


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank, no interpolation)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def machine() -> str:
    """Cores, CPU model, memory, kernel and Python of this machine, for the report."""
    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem = Path("/proc/meminfo").read_text().splitlines()[0].split()[1]
    return (
        f"{os.cpu_count()} cores ({cpu}), {int(mem) // 1024 // 1024} GiB RAM, "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}"
    )
