"""The pod's capacity with workers (issue #61): saturation requests/s and CPU per request
of the proxy (rewrite, sync) with 1 and N workers, in one run.

    python bench/workers.py                       # 1 and 2 workers, prints the table
    python bench/workers.py --workers 1,2,4,8     # a bigger machine
    python bench/workers.py --seconds 2 --rounds 3

The fast fake upstream (bench/upstream.py, 0 ms) and one pod per case: ``usage-proxy
serve`` with no ``--workers`` for one worker, ``--workers N`` for more, and for each N >= 2
the same with ``--tokenizer-threads 1`` beside the default 2. A load generator in this
process (uvloop, one pool of 64 keep-alive connections, a new pool per sample) keeps every
connection busy: embeddings with one short input and rerank 1x64 with documents seen
before (count cache hits). Each sample warms up, then counts the answers for ``--seconds``
and reads the CPU (user + system, every thread) of the supervisor and of every process
under it (the workers, from /proc/<pid>/task/<tid>/children) from /proc/<pid>/stat; the
load generator's and the upstream's CPU are read beside it. The cases take turns, round
after round, so drift in the machine's load falls on all of them alike; the table gives
the medians and ranges of the rounds.

The goals: N workers cost at most ``GOAL`` x one worker's CPU per request; and N workers
reach ``SCALING`` x N x one worker's saturation, judged only where the machine has at
least two cores per worker for the pod, the load generator and the upstream to share.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import (
    JSON,
    Process,
    cpu_seconds,
    descendants,
    exit_on_sigterm,
    rss_mb,
    start_audited_proxy,
    start_upstream,
)
from bench.workload import request

GOAL = 1.1  # N workers' CPU per request against one worker's, at most
SCALING = 0.8  # N workers' saturation against N x one worker's, at least
CONNECTIONS = 64
SCENARIOS = ("embeddings", "rerank 1x64")
WARM_UP = 0.5  # seconds of load before each sample counts


@dataclass(frozen=True)
class Case:
    """One pod's shape: its worker count and tokenizer threads per worker."""

    workers: int
    threads: int = 2

    @property
    def name(self) -> str:
        name = "1 worker" if self.workers == 1 else f"{self.workers} workers"
        return name if self.threads == 2 else f"{name}, --tokenizer-threads {self.threads}"

    def argv(self) -> tuple[str, ...]:
        """``serve`` options: no ``--workers`` for one (today's process, the default)."""
        out = ("--workers", str(self.workers)) if self.workers > 1 else ()
        return out + (("--tokenizer-threads", str(self.threads)) if self.threads != 2 else ())


def cases(counts: Sequence[int]) -> list[Case]:
    """Each count with the default threads, and each count >= 2 with one thread too."""
    out = []
    for n in counts:
        out.append(Case(n))
        if n > 1:
            out.append(Case(n, threads=1))
    return out


@dataclass
class Pod:
    """A running proxy: the process started (the supervisor with N >= 2) and its case."""

    case: Case
    process: Process

    def pids(self) -> list[int]:
        """The supervisor and every process under it."""
        return [self.process.popen.pid, *descendants(self.process.popen.pid)]

    def cpu(self) -> dict[int, float]:
        """CPU seconds so far of every process of the pod, by pid."""
        return {pid: cpu_seconds(pid) for pid in self.pids()}


@dataclass(frozen=True)
class Sample:
    """One case and scenario for one round: what was answered and what it cost."""

    case: Case
    scenario: str
    requests: int
    errors: int
    seconds: float
    pod_cpu: float  # seconds: supervisor and workers
    supervisor_cpu: float  # seconds: the supervisor alone (0 with one worker: no supervisor)
    other_cpu: float  # seconds: the load generator and the upstream
    busiest: float  # the busiest worker's share of the workers' CPU (1/N is even)
    round: int = 0


async def load(url: str, body: bytes, seconds: float, connections: int) -> tuple[int, int, float]:
    """Keep ``connections`` requests in flight for ``seconds``: (answered 200, others,
    elapsed seconds). The caller reads the CPU around it."""
    ok = errors = 0
    deadline = time.perf_counter() + seconds
    connector = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one_connection() -> None:
            nonlocal ok, errors
            while time.perf_counter() < deadline:
                async with session.post(url, data=body, headers=JSON) as response:
                    await response.read()
                    if response.status == 200:
                        ok += 1
                    else:
                        errors += 1

        started = time.perf_counter()
        await asyncio.gather(*(one_connection() for _ in range(connections)))
    return ok, errors, time.perf_counter() - started


def sample(pod: Pod, upstream: Process, scenario: str, seconds: float, connections: int) -> Sample:
    """One saturated sample of ``scenario`` on ``pod``, after a warm-up on its own pool
    (so that every worker has seen the rerank's documents and holds connections)."""
    import uvloop

    path, body = request(scenario)
    url = pod.process.url + path
    uvloop.run(load(url, body, WARM_UP, connections))
    before, other = pod.cpu(), _other_cpu(upstream)
    ok, errors, elapsed = uvloop.run(load(url, body, seconds, connections))
    after, root = pod.cpu(), pod.process.popen.pid
    spent = {pid: after[pid] - before.get(pid, 0.0) for pid in after}
    workers = [spent[pid] for pid in spent if pid != root] or [spent[root]]
    return Sample(
        case=pod.case,
        scenario=scenario,
        requests=ok,
        errors=errors,
        seconds=elapsed,
        pod_cpu=sum(spent.values()),
        supervisor_cpu=spent[root] if pod.case.workers > 1 else 0.0,
        other_cpu=_other_cpu(upstream) - other,
        busiest=max(workers) / (sum(workers) or 1.0),
    )


def _other_cpu(upstream: Process) -> float:
    """CPU seconds so far of this process (the load generator) and the upstream."""
    return time.process_time() + cpu_seconds(upstream.popen.pid)


def start_pod(case: Case, upstream: str, workdir: Path) -> Pod:
    """The proxy (rewrite, sync) in ``case``'s shape, journaling to its own file; no
    reconciliation in any case (a pod of several workers cannot reconcile yet)."""
    journal = workdir / f"journal-{case.workers}-{case.threads}.sqlite"
    extra = ("--mode", "rewrite", "--durability", "sync", "--reconcile-interval", "0")
    extra += case.argv()
    return Pod(case, start_audited_proxy(upstream, workdir, journal, *extra))


def wait_whole(pod: Pod, timeout: float = 90) -> None:
    """Ready, with every worker started: /readyz answers 200 and, with N >= 2, N
    processes run under the supervisor."""
    deadline = time.monotonic() + timeout
    pod.process.wait_ready("/readyz", timeout)
    while pod.case.workers > 1 and len(pod.pids()) - 1 < pod.case.workers:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{pod.case.name}: {len(pod.pids()) - 1} workers running")
        time.sleep(0.2)
    if pod.case.workers > 1:  # every worker answers its own /readyz on new connections
        for _ in range(8 * pod.case.workers):
            pod.process.wait_ready("/readyz", max(1.0, deadline - time.monotonic()))


@contextmanager
def pods(case_list: list[Case], upstream: str, workdir: Path) -> Iterator[list[Pod]]:
    """Every case's pod at once, each whole; all stopped on the way out."""
    started: list[Pod] = []
    try:
        for case in case_list:
            started.append(start_pod(case, upstream, workdir))
        for pod in started:
            wait_whole(pod)
        yield started
    finally:
        for pod in started:
            pod.process.stop()


def memory(pod: Pod) -> dict[str, Any]:
    """RSS in MB of the supervisor (with N >= 2) and of each worker."""
    root = pod.process.popen.pid
    workers = [rss_mb(pid) for pid in pod.pids() if pid != root] or [rss_mb(root)]
    supervisor = rss_mb(root) if pod.case.workers > 1 else None
    return {"case": pod.case.name, "supervisor_mb": supervisor, "worker_mb": workers}


def measure(
    counts: Sequence[int], seconds: float, rounds: int, connections: int = CONNECTIONS
) -> dict[str, Any]:
    """Every case and scenario, ``rounds`` interleaved rounds; the samples and memory."""
    samples: list[Sample] = []
    with tempfile.TemporaryDirectory(prefix="usage-proxy-workers-") as tmp:
        workdir = Path(tmp)
        upstream = start_upstream(0.0, workdir)
        try:
            upstream.wait_ready("/health", 60)
            with pods(cases(counts), upstream.url, workdir) as running:
                for k in range(rounds):
                    for scenario in SCENARIOS:
                        for pod in running:
                            one = sample(pod, upstream, scenario, seconds, connections)
                            samples.append(replace(one, round=k))
                rss = [memory(pod) for pod in running]
        finally:
            upstream.stop()
    return summarize(samples, rss, counts, seconds, rounds, connections)


def summarize(
    samples: list[Sample],
    rss: list[dict[str, Any]],
    counts: Sequence[int],
    seconds: float,
    rounds: int,
    connections: int,
) -> dict[str, Any]:
    """Medians and ranges per case and scenario, and each row's ratios to one worker's:
    of the medians, and the range of the ratios within each round (the cases of a round
    ran minutes apart at most, so drift in the machine's load falls on both)."""
    rows = []
    for scenario in SCENARIOS:
        for case in cases(counts):
            mine = [s for s in samples if s.case == case and s.scenario == scenario]
            if mine:
                rows.append({"scenario": scenario, "case": case.name, **figures(case, mine)})
    for r in rows:
        one = next((x for x in rows if x["scenario"] == r["scenario"] and x["workers"] == 1), None)
        if one and r["workers"] > 1:
            r["cpu_ratio"] = r["cpu_ms"] / one["cpu_ms"]
            paired = round_ratios(samples, r["scenario"], r["case"])
            r["cpu_ratio_range"] = (min(paired), max(paired))
            r["scaling"] = r["rps"] / (r["workers"] * one["rps"])
    return {
        "cores": len(os.sched_getaffinity(0)),
        "seconds": seconds,
        "rounds": rounds,
        "connections": connections,
        "rows": rows,
        "memory": rss,
    }


def round_ratios(samples: list[Sample], scenario: str, name: str) -> list[float]:
    """Per round, the case ``name``'s CPU per request over one worker's."""

    def per_request(s: Sample) -> float:
        return s.pod_cpu / max(s.requests, 1)

    mine = {s.round: s for s in samples if s.scenario == scenario and s.case.name == name}
    base = {s.round: s for s in samples if s.scenario == scenario and s.case == Case(1)}
    return [per_request(mine[k]) / per_request(base[k]) for k in sorted(mine) if k in base]


def figures(case: Case, samples: list[Sample]) -> dict[str, Any]:
    """One row: requests/s and CPU ms per request, medians with their ranges."""

    def per(value: Callable[[Sample], float]) -> list[float]:
        return [value(s) for s in samples]

    rps = per(lambda s: s.requests / s.seconds)
    cpu = per(lambda s: s.pod_cpu / max(s.requests, 1) * 1000)
    return {
        "workers": case.workers,
        "threads": case.threads,
        "rps": statistics.median(rps),
        "rps_range": (min(rps), max(rps)),
        "cpu_ms": statistics.median(cpu),
        "cpu_range": (min(cpu), max(cpu)),
        "supervisor_ms": statistics.median(
            per(lambda s: s.supervisor_cpu / max(s.requests, 1) * 1000)
        ),
        "other_ms": statistics.median(per(lambda s: s.other_cpu / max(s.requests, 1) * 1000)),
        "busiest": statistics.median(per(lambda s: s.busiest)),
        "errors": sum(s.errors for s in samples),
    }


def judged_scaling(cores: int, workers: int) -> bool:
    """Whether saturation can show scaling: two cores per worker, so that the load
    generator and the upstream do not take the pod's."""
    return cores >= 2 * workers


def goal_lines(result: dict[str, Any]) -> list[str]:
    """The goal rows: CPU per request of N workers against one (every default-thread N),
    and saturation against N x one worker's where the machine can show it."""
    lines = ["| goal | scenario | measured | met |", "|---|---|---|---|"]
    for r in result["rows"]:
        if "cpu_ratio" not in r or r["threads"] != 2:
            continue
        n, ratio = r["workers"], r["cpu_ratio"]
        met = "yes" if ratio <= GOAL else "no"
        lo, hi = r["cpu_ratio_range"]
        lines.append(
            f"| {n} workers' CPU per request <= {GOAL}x one worker's | "
            f"{r['scenario']} | {ratio:.2f}x (rounds {lo:.2f}-{hi:.2f}) | {met} |"
        )
        goal = f"{n} workers' saturation >= {SCALING} x {n} x one worker's"
        if judged_scaling(result["cores"], n):
            met = "yes" if r["scaling"] >= SCALING else "no"
            lines.append(f"| {goal} | {r['scenario']} | {r['scaling']:.2f} | {met} |")
        else:
            reason = f"{r['scaling']:.2f} (not judged: {result['cores']} cores)"
            lines.append(f"| {goal} | {r['scenario']} | {reason} | not judged |")
    if len(lines) == 2:
        lines.append(
            "| N workers against one | all | not measured: one worker count only | not measured |"
        )
    return lines


def table(result: dict[str, Any]) -> list[str]:
    """The section of docs/performance.md's generated block."""
    cores = result["cores"]
    lines = [
        "## Workers (issue #61)",
        "",
        f"The proxy (rewrite, sync) with 1 and more workers (`bench/workers.py`), "
        f"{result['connections']} keep-alive connections kept busy, "
        f"{result['rounds']} interleaved rounds of {result['seconds']:g} s per case; medians "
        "and (ranges). CPU is the pod's: the supervisor's and every worker's, summed. On "
        f"this {cores}-core machine the load generator and the upstream share the cores "
        "with the workers (their CPU per request is in the last column), so saturation "
        "cannot show scaling here; CPU per request is what the goal judges.",
        "",
        *goal_lines(result),
        "",
        "| scenario | pod | requests/s | CPU ms/request, pod | of it, the supervisor "
        "| busiest worker's CPU share | load generator + upstream CPU ms/request | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lo, hi = r["rps_range"]
        clo, chi = r["cpu_range"]
        lines.append(
            f"| {r['scenario']} | {r['case']} | {r['rps']:,.0f} ({lo:,.0f}-{hi:,.0f}) | "
            f"{r['cpu_ms']:.3f} ({clo:.3f}-{chi:.3f}) | {r['supervisor_ms']:.3f} | "
            f"{r['busiest']:.2f} | "
            f"{r['other_ms']:.3f} | {r['errors']} |"
        )
    lines += ["", "| pod | supervisor RSS (MB) | each worker's RSS (MB) |", "|---|---|---|"]
    for m in result["memory"]:
        supervisor = (
            "none (one process)" if m["supervisor_mb"] is None else f"{m['supervisor_mb']:.0f}"
        )
        each = ", ".join(f"{mb:.0f}" for mb in m["worker_mb"])
        lines.append(f"| {m['case']} | {supervisor} | {each} |")
    return lines


def counts_of(text: str) -> list[int]:
    """``1,2,4,8`` as worker counts."""
    counts = [int(part) for part in text.split(",") if part.strip()]
    if not counts or min(counts) < 1 or 1 not in counts:
        raise argparse.ArgumentTypeError("worker counts >= 1, with 1 among them (the base)")
    return counts


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=counts_of, default=[1, 2], help="1,2 (default)")
    parser.add_argument("--seconds", type=float, default=3.0, help="per sample (default 3)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved (default 3)")
    parser.add_argument("--connections", type=int, default=CONNECTIONS)
    return parser.parse_args(argv)


def main() -> int:
    args = parse()
    exit_on_sigterm()
    result = measure(args.workers, args.seconds, args.rounds, args.connections)
    print("\n".join(table(result)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
