"""The benchmark harness runs end to end (tiny smoke run; no timing is asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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
        "## Cost goals (issue #14)",
        "## Latency",
        "## Throughput",
        "## SSE",
        "## Process resources",
        "## Accounting CPU",
        "## The sync commit and its parts",
    ):
        assert heading in out
    for mode in ("`--durability sync` (the default)", "`--durability async`"):
        assert mode in out  # the cost goals, measured once per durability mode
    assert "| against the relay with an fsync'd ledger |" in out
    for target in (
        "direct",
        "minimal aiohttp relay",
        "proxy shadow",
        "proxy annotate",
        "proxy rewrite",
    ):
        assert f"| {target} |" in out
