"""Real vLLM CPU servers (0.29.0 inflated, 0.32.0 fixed) for three model families, each
with a real ``usage-proxy serve`` in front; started once per session, stopped by PID.

Start-up has its own budget (``E2E_STARTUP_BUDGET`` seconds per server, default 900: on a
loaded machine, two suites at once, every start is slower, and one budget for them all ran
out with every server healthy but late), independent of
pytest-timeout's per-test limit, which e2e tests apply to the test body only: provisioning
(normally done before pytest by ``make provision``) and server start-up are not a test's
time. At most ``E2E_START_CONCURRENCY`` (default 3) vLLM servers start at once: six at once
on 2 cores starve each other past any sensible health deadline.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from scripts.vllm_cpu import (
    Process,
    prepare_models,
    provision,
    reserved,
    start_proxy,
    start_vllm,
)
from tests.e2e.cases import (
    FAMILIES,
    MODEL_NAMES,
    REPORT,
    START_CONCURRENCY,
    STARTUP_BUDGET_S,
    TIMINGS,
    VERSIONS,
    Cluster,
    Pair,
    StartGenerate,
)

TEST_TIMEOUT_S = 300


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """e2e tests time their own body only; the cluster fixture has its own budget.

    test_families.py runs first: its fixture starts, measures and stops its servers in
    batches of three before the cluster fixture starts its six (so they never overlap)."""
    for item in items:
        if item.get_closest_marker("e2e") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(TEST_TIMEOUT_S, func_only=True))
    families = [item for item in items if item.path.name == "test_families.py"]
    if families:
        rest = [item for item in items if item.path.name != "test_families.py"]
        here = families[0].path.parent
        first = next((n for n, item in enumerate(rest) if item.path.parent == here), len(rest))
        items[:] = rest[:first] + families + rest[first:]


def start_servers(
    specs: dict[tuple[str, str], tuple[Path, Path]], logs: Path, processes: list[Process]
) -> dict[tuple[str, str], Process]:
    """Start vLLM servers, at most START_CONCURRENCY at a time, each within the start-up
    budget. Raises naming the server that failed and its log file.
    """

    def start_one(key: tuple[str, str]) -> Process:
        python, model = specs[key]
        process = start_vllm(python, model, MODEL_NAMES[key[0]], logs, slots=[slots.pop()])
        processes.append(process)
        try:
            process.wait_ready("/health", STARTUP_BUDGET_S)
        except (RuntimeError, TimeoutError) as exc:
            raise RuntimeError(
                f"vLLM {key[1]} ({key[0]}) did not start; log: {process.log}\n{exc}"
            ) from exc
        return process

    # every server's slot at once, or wait; those of servers that did not start are freed
    with reserved(len(specs)) as slots, ThreadPoolExecutor(START_CONCURRENCY) as pool:
        futures = {key: pool.submit(start_one, key) for key in specs}
        return {key: future.result() for key, future in futures.items()}


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Provision (cached), start the servers (bounded concurrency), then the proxies."""
    logs = tmp_path_factory.mktemp("e2e-logs")
    timings: dict[str, float] = {}
    started = time.monotonic()
    pythons = {v: provision(v) for v in VERSIONS}
    timings["provision_s"] = time.monotonic() - started
    models = prepare_models(pythons[VERSIONS[0]])
    processes: list[Process] = []
    try:
        specs = {
            (family, version): (pythons[version], models[family])
            for family in FAMILIES
            for version in VERSIONS
        }
        servers = start_servers(specs, logs, processes)
        timings["vllm_start_all_s"] = time.monotonic() - started - timings["provision_s"]
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


GENERATE_RELEASE = "0.32.0"


@contextlib.contextmanager
def _generating(
    logs: Path, context: int, *extra: str, env: dict[str, str] | None = None
) -> Iterator[Process]:
    """vLLM 0.32.0 serving the tiny random Qwen3 as a generate model named ``gen`` with a
    ``context``-token window (and ``extra`` arguments, ``env``), ready; stopped after."""
    model = prepare_models(provision(VERSIONS[0]))["generate"]
    with reserved(1) as slots:
        server = start_vllm(
            provision(GENERATE_RELEASE),
            model,
            "gen",
            logs,
            extra_args=["--runner", "generate", "--max-model-len", str(context), *extra],
            env=env,
            slots=[slots.pop()],
        )
    try:
        server.wait_ready("/health", STARTUP_BUDGET_S)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def generating() -> StartGenerate:
    """Starts a generating vLLM 0.32.0 (``_generating``): the set-up the tests of tenant
    doors, caps and prompt counts share; skipped where 0.32.0 is not an e2e release."""
    if GENERATE_RELEASE not in VERSIONS:
        pytest.skip(f"vLLM {GENERATE_RELEASE} is not among the e2e releases")
    return _generating


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print the matrix: reported vs processed vs billed, and 0.32's figure beside it."""
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
