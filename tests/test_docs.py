"""Docs that must not drift from the code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

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


def test_every_test_a_document_names_exists() -> None:
    """The README and every document under docs/ name tests as ``tests/…py`` or
    ``tests/…py::test_name``: each file exists and each name is defined in it (a test
    moved or renamed leaves no reader at a dead end)."""
    wrong = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text()
        for path, name in re.findall(r"(tests/[\w/]+\.py)(?:::(test_\w+))?", text):
            module = ROOT / path
            if not module.exists():
                wrong.append(f"{doc.name}: {path}")
            elif name and name not in _test_names(module):
                wrong.append(f"{doc.name}: {path}::{name}")
    assert wrong == []


def test_report_columns_are_documented_as_the_code_explains_them() -> None:
    """docs/metering.md's report column table is what proxy/ledger/report.py's column
    meanings generate (the HTML page and the table print the same meanings)."""
    from proxy.ledger.report import columns_reference

    text = (ROOT / "docs" / "metering.md").read_text()
    start = text.index("<!-- report-columns:start -->\n") + len("<!-- report-columns:start -->\n")
    end = text.index("<!-- report-columns:end -->")
    assert text[start:end] == columns_reference()


def test_troubleshooting_quotes_what_the_code_prints(tmp_path: Path) -> None:
    """Each start-up and readiness message the README's troubleshooting quotes is a part of
    what the code prints for that mistake (placeholders in capitals stand for values)."""
    import errno

    from proxy.journal_commands import nothing_reconciled
    from proxy.serving.catalog import discovery_problem, missing_directory
    from proxy.serving.startup import journal_problem, listen_problem
    from proxy.serving.tenancy import DIGEST_RECIPE, KeyFileError, load_api_keys
    from proxy.serving.upstream import UpstreamError

    readme = " ".join((ROOT / "README.md").read_text().split())
    section = readme[readme.index("## Troubleshooting") :]

    def key_file_says(path: Path) -> str:
        with pytest.raises(KeyFileError) as caught:
            load_api_keys(path)
        return f"--api-keys {caught.value}".replace(str(path), "FILE")

    plain = tmp_path / "keys.yaml"
    plain.write_text("T: the-key\n")
    printed = {
        "cannot listen on HOST:PORT (--port): address already in use; ": str(
            listen_problem(OSError(errno.EADDRINUSE, "in use"), "HOST", 0, "--port")
        ).replace(":0 ", ":PORT "),
        "--api-keys FILE: no such file; ": key_file_says(tmp_path / "none.yaml"),
        "tenant 'T' has a value that is not a SHA-256 hex digest (a plaintext key?); ": (
            key_file_says(plain)
        ),
        DIGEST_RECIPE: DIGEST_RECIPE,
        "cannot open the journal PATH (--journal): ": str(
            journal_problem(OSError(errno.EROFS, "x"), "PATH")
        ),
        "ends in /v1: give vLLM's root (": discovery_problem("http://h/v1", UpstreamError(502, "")),
        "model directory PATH (root in /v1/models) is not in the proxy's container": str(
            missing_directory("/PATH", "m", overridden=False)
        ).replace("/PATH", "PATH"),
        "models.<name>.tokenizer: PATH is not a directory in the proxy's container": str(
            missing_directory("/PATH", "<name>", overridden=True)
        ).replace("/PATH", "PATH"),
        "no reconciliation window": nothing_reconciled(Path("j"), None, None),
    }
    for quoted, output in printed.items():
        assert quoted in section, quoted
        assert quoted.rstrip("; ") in output, (quoted, output)
