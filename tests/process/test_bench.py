"""The benchmark harness runs end to end (tiny smoke run; no timing is asserted), its
renderer rewrites only the generated block of docs/performance.md, and bench/'s modules
import one way."""

from __future__ import annotations

import argparse
import ast
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.ratios import GOALS
from bench.render import END, START, splice
from bench.workers import Case, Sample
from tests.support.waits import eventually

ROOT = Path(__file__).resolve().parents[2]
PERFORMANCE = ROOT / "docs" / "performance.md"

# Each bench module may import only modules of a lower layer.
LAYERS = {
    "workload": 0,
    "harness": 0,
    "upstream": 0,
    "minimal_relay": 0,
    "journal_workers": 0,
    "reuseport": 0,
    "costs": 1,
    "admission": 1,
    "ratios": 1,
    "soak": 1,
    "memory": 1,
    "instructions": 1,
    "frontend": 1,
    "gateway": 1,
    "workers": 1,
    "render": 2,
    "run": 3,
}


def test_bench_smoke() -> None:
    """bench/run.py --smoke measures every target and prints every table."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--smoke"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        check=True,
    ).stdout
    for heading in (
        "## Goals (issues #42 and #51)",
        "## Against vLLM's own front end (issue #42)",
        "## Against LiteLLM's proxy (issue #42)",
        "## Relay ratios (issue #29; retired as goals, information only)",
        "## Event loops (issue #29)",
        "## Latency",
        "## Throughput",
        "## SSE",
        "## Process resources",
        "## Accounting CPU",
        "## The sync commit and its parts",
        "## What admission adds",
        "## Workers (issue #61)",
    ):
        assert heading in out
    for goal in GOALS:  # both modes against their floors, information: no verdict (#42)
        assert re.search(rf"\| {re.escape(goal.name)} \| [^|]+ \| [^|]+ \|\n", out)
    for target in (
        "direct",
        "minimal aiohttp relay",
        "proxy shadow",
        "proxy annotate",
        "proxy rewrite",
    ):
        assert f"| {target} |" in out


def test_splice_replaces_only_the_marked_block() -> None:
    """The text before and after the markers comes back byte for byte; the old block goes."""
    before = "# Performance\n\nHow it is measured.\n\n"
    after = "\n\n## History\n\nWhat each change bought.\n"
    document = f"{before}{START}\nold figures\n{END}{after}"
    spliced = splice(document, "new figures\n")
    assert spliced == f"{before}{START}\nnew figures\n{END}{after}"
    assert splice(spliced, "new figures\n") == spliced


@pytest.mark.parametrize(
    "document",
    [
        "no markers at all",
        f"only {START} and no end",
        f"{END} before {START}",
        f"{START} a {END} and {START} b {END}",
    ],
)
def test_splice_refuses_a_document_without_one_marked_block(document: str) -> None:
    """Without exactly one block to replace, nothing is written over hand-written text."""
    with pytest.raises(ValueError, match="bench"):
        splice(document, "figures")


def test_performance_doc_keeps_its_prose_outside_the_block() -> None:
    """docs/performance.md has one generated block, and the method and history sit outside
    it, so a bench run cannot overwrite them; splicing its own block changes nothing."""
    document = PERFORMANCE.read_text()
    head, _, rest = document.partition(START)
    block, _, tail = rest.partition(END)
    assert "## How the figures are taken" in head
    assert "## What each change bought" in tail
    assert "## Relay ratios (issue #29; retired as goals" in block
    assert splice(document, block) == document


def bench_imports(path: Path) -> set[str]:
    """The bench modules that the module at ``path`` imports."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom) or node.module is None:
            continue
        if node.module == "bench":
            names |= {alias.name for alias in node.names}
        elif node.module.startswith("bench."):
            names.add(node.module.removeprefix("bench."))
    return names


def test_bench_modules_import_only_lower_layers() -> None:
    """No import loop among bench/'s modules: each imports only modules below its layer."""
    modules = {path.stem: path for path in (ROOT / "bench").glob("*.py")}
    assert set(modules) == set(LAYERS)  # a new module is placed in a layer
    for name, path in modules.items():
        for other in bench_imports(path):
            assert LAYERS[other] < LAYERS[name], f"bench/{name}.py imports bench/{other}.py"


async def test_cores_awake_leaves_no_spinner_behind() -> None:
    """The idle-class spinners that keep the cores awake for sequential measurements run in
    the idle scheduling class, one per core, and are gone when the block ends, even when
    it ends with an error."""
    from bench.harness import cores_awake

    seen: list[subprocess.Popen[bytes]] = []

    async def measure() -> None:
        with cores_awake() as spinners:
            seen.extend(spinners)
            assert len(spinners) == (os.cpu_count() or 1)
            for spinner in spinners:

                async def idle_class(pid: int = spinner.pid) -> bool:
                    return os.sched_getscheduler(pid) == os.SCHED_IDLE

                await eventually(idle_class)
            raise RuntimeError("the measurement failed")

    with pytest.raises(RuntimeError, match="measurement failed"):
        await measure()
    assert seen
    assert all(spinner.poll() is not None for spinner in seen)


def test_listening_pid_finds_the_descendant_on_the_port() -> None:
    """The API server is found as the process under the started one that listens on the
    port (vLLM's engine core, also a child, listens on none); not the parent itself."""
    from bench.harness import free_port, listening_pid

    port = free_port()
    code = (
        "import socket, time; s = socket.socket(); "
        f"s.bind(('127.0.0.1', {port})); s.listen(); print('up', flush=True); time.sleep(30)"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == b"up\n"
        assert listening_pid(os.getpid(), port) == child.pid
        with pytest.raises(RuntimeError, match="listens on port"):
            listening_pid(os.getpid(), free_port())
    finally:
        child.kill()
        child.communicate()  # reaps it and closes its pipe


def test_comparison_tables_judge_only_what_was_measured() -> None:
    """A measured row gets yes or no against its goal; the chat row without a generate model
    and a LiteLLM that is not installed are said so and never judged."""
    from bench import frontend, gateway

    measured = {"workload": "score N:N 32", "vllm_ms": 5.6, "proxy_ms": 2.9}
    cheap = {**measured, "workload": "rerank", "proxy_ms": 1.0}
    rows = [
        {**measured, "ratio": 2.9 / 5.6},
        {**cheap, "ratio": 1.0 / 5.6},
        {"workload": frontend.CHAT, "skipped": frontend.NO_GENERATE_MODEL},
    ]
    lines = frontend.table({"version": "0.29.0", "rows": rows})
    assert lines[2].endswith("| 0.52x | no |")
    assert lines[3].endswith("| 0.18x | yes |")
    assert "| skipped: no generate model could be built" in lines[4]
    assert lines[4].endswith("| | | |")  # no verdict
    relay = {"cpu_ms": 0.7, "p50_ms": 1.5}
    row = {"workload": "embeddings x1", "relay": relay, "proxy": relay}
    out = gateway.table({"rows": [row], "skipped": "LiteLLM is not installed"})
    assert out[2].endswith("| not measured | not measured |")
    assert "LiteLLM not measured" in out[-1]


def test_the_small_request_is_judged_per_durability() -> None:
    """One short embedding is judged twice (issue #51): the sync proxy against the durable
    relay in the same run (<= 1.2x), the async proxy against vLLM's API server (<= 0.30x);
    without the durable relay it falls back to the 0.25x row, never judged on nothing."""
    from bench import frontend

    floors = {frontend.RELAY: 0.8, frontend.DURABLE: 1.3, frontend.ASYNC: 1.2}
    row = {
        "workload": frontend.SMALL,
        "requests": 150,
        "vllm_ms": 3.5,
        "proxy_ms": 1.5,
        "ratio": 1.5 / 3.5,
        "floors_ms": floors,
    }
    sync, late = frontend.verdicts(row)
    assert (round(sync.ratio, 2), sync.met) == (1.15, True)
    assert (round(late.ratio, 2), late.met) == (0.34, False)
    lines = frontend.table({"version": "0.29.0", "rows": [row]})
    assert lines[2].endswith("| judged by durability (below) |")
    assert (
        "| proxy, --durability sync | 1.50 | 0.43x | 1.15x | <= 1.2x the durable relay | yes |"
        in lines
    )
    assert lines[-1] == (
        "| proxy, --durability async | 1.20 | 0.34x | 0.92x | <= 0.30x vLLM's API server | no |"
    )
    (alone,) = frontend.verdicts({**row, "floors_ms": {}})
    assert alone.name.startswith(f"proxy CPU <= {frontend.GOAL}x")
    assert alone.met is False


def test_the_gateway_judges_the_async_proxy_and_shows_the_commit() -> None:
    """The LiteLLM goal takes the async proxy's added p50; the sync proxy's is shown beside
    it, with what its commit adds (sync less async p50), and judged nowhere."""
    from bench import gateway

    def f(p50: float) -> dict[str, float]:
        return {"cpu_ms": 1.0, "p50_ms": p50}

    row = {
        "workload": "embeddings x1",
        "relay": f(1.0),
        "durable": f(1.5),
        "proxy": f(2.0),
        "proxy_sync": f(2.6),
        "litellm": f(21.0),
        "ratio": 0.05,
    }
    out = gateway.table({"rows": [row]})
    assert out[2] == ("| embeddings x1 | 1.00 / 1.00 | 1.00 / 2.00 | 1.00 / 21.00 | 0.05x | yes |")
    assert out[-1] == (
        "| embeddings x1 | 1.00 / 1.50 | 1.00 / 2.60 | +1.60 ms | +0.60 ms | +0.50 ms |"
    )


def test_the_floors_table_shares_each_floor_of_the_api_server() -> None:
    """With --floors, each relay floor and the proxy are given as CPU per request and as a
    share of the API server's; without them there is no floors table."""
    from bench import frontend

    floors = {frontend.RELAY: 1.0, frontend.DURABLE: 2.0}
    row = {"workload": "embeddings, 1 input", "vllm_ms": 5.0, "proxy_ms": 3.0}
    lines = frontend.floors_table({"version": "0.29.0", "rows": [{**row, "floors_ms": floors}]})
    assert lines[2] == (
        "| embeddings, 1 input | 5.00 | 1.00 (0.20x) | 2.00 (0.40x) | 3.00 (0.60x) |"
    )
    assert frontend.floors_table({"version": "0.29.0", "rows": [row]}) == []


def test_sigterm_stops_what_the_bench_started(tmp_path: Path) -> None:
    """A bench ended by SIGTERM (``exit_on_sigterm``, as bench/frontend.py and bench/run.py
    install it) stops the server it started on its way out, as Ctrl-C does, instead of
    leaving it running in its own session; its exit status says SIGTERM (143)."""
    code = f"""
import sys, time
sys.path.insert(0, {str(ROOT)!r})
from pathlib import Path
from bench.harness import exit_on_sigterm
from scripts.vllm_cpu import _spawn
exit_on_sigterm()
server = _spawn("server", ["sleep", "300"], {{}}, Path({str(tmp_path)!r}) / "server.log", 0)
try:
    print(server.popen.pid, flush=True)
    time.sleep(60)
finally:
    server.stop()
"""
    bench = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert bench.stdout is not None
        server = int(bench.stdout.readline())
        os.kill(server, 0)  # running, in a session of its own
        bench.terminate()
        assert bench.wait(30) == 143
        with pytest.raises(ProcessLookupError):
            os.kill(server, 0)
    finally:
        bench.kill()
        bench.communicate()


def _samples(case: Case, scenario: str, requests: int, cpu: tuple[float, ...]) -> list[Sample]:
    """Samples of one second, one per round: ``requests`` answered for ``cpu[k]`` seconds
    of the pod's CPU in round k."""
    return [
        Sample(case, scenario, requests, 0, 1.0, spent, 0.01, 0.5, 0.5, round=k)
        for k, spent in enumerate(cpu)
    ]


def test_the_workers_cases_pass_no_workers_flag_for_one() -> None:
    """One worker is today's process (no --workers, so the bench runs before the flag
    exists); each count >= 2 runs with the default tokenizer threads and with one."""
    from bench.workers import cases, counts_of

    assert cases([1, 2]) == [Case(1), Case(2), Case(2, threads=1)]
    assert Case(1).argv() == ()
    assert Case(2).argv() == ("--workers", "2")
    assert Case(4, threads=1).argv() == ("--workers", "4", "--tokenizer-threads", "1")
    assert Case(2, threads=1).name == "2 workers, --tokenizer-threads 1"
    assert counts_of("1,2,4,8") == [1, 2, 4, 8]
    with pytest.raises(argparse.ArgumentTypeError, match="1 among them"):
        counts_of("2,4")


def test_the_workers_goal_judges_cpu_per_request_against_one_worker() -> None:
    """Two workers are judged against one worker's CPU per request (<= 1.1x), per scenario,
    on the medians of the rounds; saturation against 2 x one worker's is shown but not
    judged on a machine with fewer than two cores per worker."""
    from bench.workers import goal_lines, summarize, table

    one, two, thin = Case(1), Case(2), Case(2, threads=1)
    samples = [
        # one worker: 1,000 requests for 0.5 s of CPU (0.5 ms each); rounds 0.4 and 0.6
        *_samples(one, "embeddings", 1000, (0.4, 0.5, 0.6)),
        # two workers: 0.6 ms each (1.2x, over the goal), with one outlier round
        *_samples(two, "embeddings", 1000, (0.6, 0.6, 2.0)),
        *_samples(thin, "embeddings", 1000, (0.5, 0.5, 0.5)),
        *_samples(one, "rerank 1x64", 500, (0.5, 0.5, 0.5)),
        *_samples(two, "rerank 1x64", 1000, (1.05, 1.05, 1.05)),
    ]
    result = summarize(samples, [], [1, 2], 1.0, 3, 64)
    result["cores"] = 2
    lines = goal_lines(result)
    goal = "| 2 workers' CPU per request <= 1.1x one worker's |"
    assert f"{goal} embeddings | 1.20x (rounds 1.20-3.33) | no |" in lines
    assert f"{goal} rerank 1x64 | 1.05x (rounds 1.05-1.05) | yes |" in lines
    assert (
        "| 2 workers' saturation >= 0.8 x 2 x one worker's | rerank 1x64 "
        "| 1.00 (not judged: 2 cores) | not judged |" in lines
    )
    assert not any("tokenizer-threads" in line for line in lines)  # shown, not judged
    result["cores"] = 16
    assert (
        "| 2 workers' saturation >= 0.8 x 2 x one worker's | embeddings | 0.50 | no |"
        in goal_lines(result)
    )
    rendered = "\n".join(table(result))
    assert (
        "| embeddings | 2 workers | 1,000 (1,000-1,000) | 0.600 (0.600-2.000) | 0.010 |" in rendered
    )
    assert "| embeddings | 1 worker | 1,000 (1,000-1,000) | 0.500 (0.400-0.600) |" in rendered


def test_the_pods_cpu_counts_the_supervisor_and_every_worker(tmp_path: Path) -> None:
    """A pod's CPU is read from the process started and every process under it: a child
    that burns CPU shows under its own pid, and the pod's sum holds it."""
    from bench.workers import Pod
    from scripts.vllm_cpu import Process

    burn = (
        "import time\n"
        "end = time.process_time() + 0.3\n"
        "while time.process_time() < end: pass\n"
        "time.sleep(30)"
    )
    code = (
        "import subprocess, sys, time\n"
        f"child = subprocess.Popen([sys.executable, '-c', {burn!r}])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(30)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = 0
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        pod = Pod(Case(2), Process("pod", "http://127.0.0.1:1", parent, tmp_path / "log"))
        assert pod.pids() == [parent.pid, child]

        deadline = time.monotonic() + 10
        while pod.cpu()[child] < 0.25 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sum(pod.cpu().values()) >= 0.25
    finally:
        if child:
            os.kill(child, signal.SIGKILL)
        parent.kill()
        parent.communicate()
