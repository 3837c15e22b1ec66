"""A pod's life on the supervisor's loop (its behaviour as processes: tests/process),
with stand-in workers (plain child processes): a stop while a worker is being started, a
worker that outlives the drain patience."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.serving.podlife import KILLED, Child, Pod
from proxy.serving.podstart import runtime_dir
from proxy.settings import Settings

SETTINGS = {"upstream": "http://vllm:8000", "workers": 2, "journal": "off"}
SLEEPER = "import time; time.sleep(60)"
DEAF = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('deaf', flush=True); time.sleep(60)"
)


class StandIns(Pod):
    """A pod whose workers are ``code`` run by Python, started after ``delay`` seconds
    (``spawning`` is set when a start begins)."""

    def __init__(self, runtime: Path, code: str, delay: float) -> None:
        super().__init__(Settings(**SETTINGS), 2, runtime)
        self.code_run, self.delay = code, delay
        self.spawning = asyncio.Event()
        self.started: list[Child] = []

    async def _spawn(self, index: int) -> Child:
        self.spawning.set()
        await asyncio.sleep(self.delay)
        spawned = await asyncio.create_subprocess_exec(
            sys.executable, "-c", self.code_run, stdout=asyncio.subprocess.PIPE
        )
        child = self.children[index] = Child(index, spawned)
        self.started.append(child)
        return child

    def _handle_signals(self) -> None:
        """The test's loop keeps its own signal handlers."""


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A pod's runtime directory (no operator's metrics directory)."""
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    with runtime_dir() as (root, _):
        yield root


async def test_a_stop_while_a_worker_is_being_started_still_drains(runtime: Path) -> None:
    """A stop that arrives while the workers' processes are being created (the drain
    lists no live worker yet) ends the pod: each worker, once started, gets SIGTERM."""
    pod = StandIns(runtime, SLEEPER, delay=0.5)
    run = asyncio.create_task(pod.run())
    await pod.spawning.wait()
    pod.stop()
    async with asyncio.timeout(10):
        code = await run
    assert code == 0
    assert len(pod.started) == 2
    assert [c.process.returncode for c in pod.started] == [-signal.SIGTERM] * 2


async def test_a_worker_that_outlives_the_patience_is_killed_and_the_pod_exits_1(
    runtime: Path,
) -> None:
    """The supervisor waits ``patience`` for the drain, then SIGKILLs what is left: the
    pod exits 1. While it drains the pod is not ready ("draining", so /readyz is 503),
    and a second signal changes nothing."""
    pod = StandIns(runtime, DEAF, delay=0)
    pod.patience = 0.5
    run = asyncio.create_task(pod.run())
    async with asyncio.timeout(10):
        while len(pod.started) < 2:
            await asyncio.sleep(0.05)
        for child in pod.started:
            assert child.process.stdout is not None
            assert await child.process.stdout.readline() == b"deaf\n"
        pod.stop()
        await asyncio.sleep(0.1)
        ready, body = pod.report()
        assert not ready
        assert body["problems"]["pod"] == "draining"
        pod.stop(3)  # a second signal: the first reason stands
        code = await run
    assert code == KILLED
    assert [c.process.returncode for c in pod.started] == [-signal.SIGKILL] * 2
