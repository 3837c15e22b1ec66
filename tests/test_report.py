"""usage-proxy report: figures checked against hand-computed totals, in every format."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from proxy.cli import main
from proxy.journal import Journal
from proxy.records import UsageRecord

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


def rec(
    i: int,
    tenant: str,
    endpoint: str,
    reported: int,
    billed: int,
    completion: int = 0,
    verdict: str = "corrected",
    when: datetime = NOW,
) -> UsageRecord:
    return UsageRecord(
        client_request_id=f"r{i}",
        time=when,
        tenant=tenant,
        model="minilm",
        endpoint=endpoint,
        operation="x",
        prompt_tokens_reported=reported,
        prompt_tokens_billed=billed,
        completion_tokens_reported=completion,
        completion_tokens_billed=completion,
        verdict=verdict,
        status=200,
        latency_ms=1.0,
        instance="t",
    )


@pytest.fixture
async def journal_path(tmp_path: Path) -> Path:
    path = tmp_path / "j.sqlite"
    journal = Journal(path)
    await journal.open()
    for r in [
        rec(1, "a", "/rerank", 57, 36),
        rec(2, "a", "/rerank", 57, 36),
        rec(3, "a", "/v1/chat/completions", 5, 5, completion=3, verdict="reported"),
        rec(4, "b", "/score", 19, 18),
        rec(5, "b", "/score", 19, 18, when=NOW - timedelta(days=30)),
    ]:
        await journal.append(r)
    await journal.close()
    return path


def run(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["report", *args]) == 0
    return capsys.readouterr().out


def test_json_totals(journal_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """a: 57+57+8 reported, 36+36+8 billed, 42 over (52.5 %); b (in range): 19/18."""
    rows = json.loads(
        run(capsys, "--journal", str(journal_path), "--format", "json", "--since", "2026-11-01")
    )
    assert rows == [
        {
            "tenant": "a",
            "model": "minilm",
            "requests": 3,
            "reported_tokens": 122,
            "billed_tokens": 80,
            "verdicts": {"corrected": 2, "reported": 1},
            "over_reported": 42,
            "over_reported_pct": 52.5,
        },
        {
            "tenant": "b",
            "model": "minilm",
            "requests": 1,
            "reported_tokens": 19,
            "billed_tokens": 18,
            "verdicts": {"corrected": 1},
            "over_reported": 1,
            "over_reported_pct": 5.56,
        },
    ]


def test_whole_range_and_csv(journal_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without a range every record counts; CSV has a header and one row per group."""
    rows = list(
        csv.DictReader(io.StringIO(run(capsys, "--journal", str(journal_path), "--format", "csv")))
    )
    assert [(r["tenant"], r["requests"], r["billed_tokens"]) for r in rows] == [
        ("a", "3", "80"),
        ("b", "2", "36"),
    ]


def test_table_and_html(
    journal_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The table lists every group; the HTML page holds a bar per tenant."""
    table = run(capsys, "--journal", str(journal_path))
    assert "tenant" in table.splitlines()[0]
    assert len(table.splitlines()) == 4
    out = tmp_path / "r.html"
    run(capsys, "--journal", str(journal_path), "--format", "html", "--output", str(out))
    page = out.read_text()
    assert page.count("<rect") == 2
    assert "<svg" in page


def test_missing_journal_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No journal at the path: exit 2 and say where it looked."""
    assert main(["report", "--journal", str(tmp_path / "none.sqlite")]) == 2
    assert "no journal at" in capsys.readouterr().err
