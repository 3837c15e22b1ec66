"""Docs that must not drift from the code."""

from __future__ import annotations

from pathlib import Path

from proxy.ledger.records import UsageRecord
from proxy.ledger.sinks.postgres import LEDGER_DDL

ROOT = Path(__file__).resolve().parent.parent


def test_ledger_sql_matches_the_code() -> None:
    """docs/ledger.sql is the DDL the proxy runs."""
    assert LEDGER_DDL.strip() in (ROOT / "docs" / "ledger.sql").read_text()


def test_record_schema_documented() -> None:
    """Every record field appears in docs/metering.md."""
    text = (ROOT / "docs" / "metering.md").read_text()
    missing = [name for name in UsageRecord.model_fields if f"`{name}`" not in text]
    assert missing == []


def test_readme_configuration_reference_is_generated() -> None:
    """The README's option table is exactly what the settings model generates."""
    from proxy.settings import reference_table

    text = (ROOT / "README.md").read_text()
    start = text.index("<!-- config:start -->\n") + len("<!-- config:start -->\n")
    end = text.index("<!-- config:end -->")
    assert text[start:end] == reference_table()
