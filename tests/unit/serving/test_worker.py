"""A pod's worker process before it serves: SIGHUP never ends it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def ignores(pid: int, sig: signal.Signals) -> bool:
    """Whether process ``pid`` ignores ``sig`` (its SigIgn mask in /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


def test_a_worker_still_starting_survives_sighup() -> None:
    """The supervisor forwards SIGHUP to every worker, started or not: a worker ignores
    it from the start of its main (its reload handler comes once it listens), so one still
    reading its orders lives on."""
    worker = subprocess.Popen(
        [sys.executable, "-m", "proxy.serving.worker"],
        stdin=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not ignores(worker.pid, signal.SIGHUP) and time.monotonic() < deadline:
            assert worker.poll() is None
            time.sleep(0.05)
        os.kill(worker.pid, signal.SIGHUP)
        time.sleep(0.3)
        assert worker.poll() is None
    finally:
        worker.kill()
        worker.wait()
        assert worker.stdin is not None
        worker.stdin.close()
