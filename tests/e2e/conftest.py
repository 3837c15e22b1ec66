"""Real vLLM CPU servers (0.29.0 inflated, 0.32.0 fixed) for three model families, each
with a real ``usage-proxy serve`` in front; started once per session, stopped by PID."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest

from scripts.vllm_cpu import Process, prepare_models, provision, start_proxy, start_vllm

VERSIONS = ("0.29.0", "0.32.0")
FAMILIES = ("bi-encoder", "cross-encoder", "late-interaction")
MODEL_NAMES = {
    "bi-encoder": "minilm",
    "cross-encoder": "tiny-ce",
    "late-interaction": "tiny-colbert",
}


@dataclass(frozen=True)
class Pair:
    """One vLLM server and the proxy (rewrite mode) in front of it."""

    vllm: str
    proxy: str
    model: str


TIMINGS: dict[str, float] = {}


@dataclass(frozen=True)
class Cluster:
    pairs: dict[tuple[str, str], Pair]
    timings: dict[str, float]


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Provision (cached), start every server in parallel, wait for health, then proxies."""
    logs = tmp_path_factory.mktemp("e2e-logs")
    timings: dict[str, float] = {}
    started = time.monotonic()
    pythons = {v: provision(v) for v in VERSIONS}
    timings["provision_s"] = time.monotonic() - started
    models = prepare_models(pythons[VERSIONS[0]])
    processes: list[Process] = []
    try:
        servers = {
            (family, version): start_vllm(
                pythons[version], models[family], MODEL_NAMES[family], logs
            )
            for family in FAMILIES
            for version in VERSIONS
        }
        processes.extend(servers.values())
        with ThreadPoolExecutor(len(servers)) as pool:
            ready = list(pool.map(lambda p: p.wait_ready("/health", 600), servers.values()))
        timings["vllm_start_max_s"] = max(ready)
        proxies = {key: start_proxy(server.url, logs) for key, server in servers.items()}
        processes.extend(proxies.values())
        for proxy in proxies.values():
            proxy.wait_ready("/readyz", 60)
        pairs = {
            key: Pair(servers[key].url, proxies[key].url, MODEL_NAMES[key[0]]) for key in servers
        }
        timings["proxies_ready_s"] = time.monotonic() - started - timings["provision_s"]
        TIMINGS.update(timings)
        yield Cluster(pairs, timings)
    finally:
        for process in processes:
            process.stop()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print the matrix: reported vs processed vs billed, and 0.32's figure beside it."""
    from tests.e2e.test_real_vllm import REPORT

    if not REPORT:
        return
    write = terminalreporter.write_line
    write("")
    write("e2e timings: " + ", ".join(f"{k}={v:.1f}" for k, v in TIMINGS.items()))
    write("e2e matrix: family / case / 0.29 reported / 0.29 processed / billed / 0.32 reported")
    for row in REPORT:
        if "billed" not in row:
            write(f"  {row['family']:16} {row['case']:26} status {row['status']}")
            continue
        flag = (
            "" if row["billed"] == row["reported_0_32"] else "   <- versions truncate differently"
        )
        write(
            f"  {row['family']:16} {row['case']:26} {row['reported_0_29']:6} "
            f"{row['processed_0_29']:6} {row['billed']:6} {row['reported_0_32']:6} "
            f"{row['verdict']}{flag}"
        )
