"""Docs that must not drift from the code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from proxy.ledger.records import UsageRecord
from proxy.ledger.sinks.postgres import LEDGER_DDL

ROOT = Path(__file__).resolve().parent.parent


def test_the_ledger_has_a_column_for_every_record_field() -> None:
    """The DDL the proxy runs (proxy/ledger/sinks/ledger.sql, the one copy) stores every
    field of the record, and the migration is not part of it."""
    for name in UsageRecord.model_fields:
        assert f"    {name} " in LEDGER_DDL, name
    assert "ALTER TABLE" not in LEDGER_DDL


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


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    return {n.name for n in ast.walk(tree) if isinstance(n, functions)}


def test_every_guarantee_names_a_test_that_exists() -> None:
    """docs/reliability.md maps each guarantee to its tests: each ``tests/…py`` exists, each
    ``path::name`` is defined there, and each bare ``test_…`` in the last module named
    before it on its line."""
    wrong = []
    for line in (ROOT / "docs" / "reliability.md").read_text().splitlines():
        module: Path | None = None
        for path, name in re.findall(r"`(tests/[\w/]+\.py)?(?:::)?(test_\w+)?`", line):
            if path:
                module = ROOT / path
                if not module.exists():
                    wrong.append(path)
                    continue
            if name and (module is None or name not in _test_names(module)):
                wrong.append(f"{module and module.relative_to(ROOT)}::{name}")
    assert wrong == []


def test_report_columns_are_documented_as_the_code_explains_them() -> None:
    """docs/metering.md's report column table is what proxy/ledger/report.py's column
    meanings generate (the HTML page and the table print the same meanings)."""
    from proxy.ledger.report import columns_reference

    text = (ROOT / "docs" / "metering.md").read_text()
    start = text.index("<!-- report-columns:start -->\n") + len("<!-- report-columns:start -->\n")
    end = text.index("<!-- report-columns:end -->")
    assert text[start:end] == columns_reference()
