"""The exporters the settings configure, and what they cost a proxy that has none."""

from __future__ import annotations

import subprocess
import sys

from proxy.ledger.exporters import build_sinks
from proxy.ledger.sinks.jsonl import JsonLinesSink
from proxy.ledger.sinks.postgres import PostgresLedger
from proxy.settings import Settings

WITHOUT_LEDGER = """
import sys
from proxy.cli import main  # noqa: F401 (every module usage-proxy serve loads)
from proxy.ledger.exporters import build_sinks
from proxy.serving import process  # noqa: F401
from proxy.settings import Settings
build_sinks(Settings(upstream="http://x", jsonl="-"))
print("asyncpg" in sys.modules)
"""


def test_a_proxy_without_a_ledger_does_not_load_asyncpg() -> None:
    """asyncpg (a required dependency, see pyproject.toml) is imported only when a
    PostgreSQL ledger is configured: ``serve`` without ``--ledger-dsn`` never loads it."""
    run = subprocess.run(
        [sys.executable, "-c", WITHOUT_LEDGER], capture_output=True, text=True, check=True
    )
    assert run.stdout.strip() == "False"


def test_each_configured_exporter_is_built() -> None:
    """A DSN gives the PostgreSQL ledger, a path the JSON lines sink, in that order."""
    sinks = build_sinks(Settings(upstream="http://x", ledger_dsn="postgresql://h/db", jsonl="-"))
    assert [type(s) for s in sinks] == [PostgresLedger, JsonLinesSink]
