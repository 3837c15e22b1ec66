"""usage-proxy report: figures checked against hand-computed totals, in every format."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from proxy.accounting.routes import BY_PATH
from proxy.cli import main
from proxy.ledger.journal import Journal
from proxy.ledger.records import UsageRecord
from proxy.ledger.report import aggregate, as_html, as_table

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
        operation=BY_PATH[endpoint].operation,
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


def test_json_rows_totals_and_period(
    journal_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """a: 57+57 reported, 36+36 billed (rerank), 8/8 (chat); b (in range): 19/18; totals
    add up; the object names the period and when it was made."""
    report = json.loads(
        run(
            capsys,
            *("--journal", str(journal_path), "--format", "json", "--since", "2026-11-01"),
            *("--group-by", "tenant,operation"),
        )
    )
    assert report["since"] == "2026-11-01T00:00:00+00:00"
    assert report["until"] is None
    assert report["generated_at"]
    assert report["group_by"] == ["tenant", "operation"]
    got = [
        (r["tenant"], r["operation"], r["requests"], r["reported_tokens"], r["billed_tokens"])
        for r in report["rows"]
    ]
    assert got == [("a", "chat", 1, 8, 8), ("a", "rerank", 2, 114, 72), ("b", "score", 1, 19, 18)]
    totals = report["totals"]
    assert (totals["tenant"], totals["requests"], totals["reported_tokens"]) == ("TOTAL", 4, 141)
    assert (totals["billed_tokens"], totals["over_reported"]) == (98, 43)
    assert totals["over_reported_pct"] == 43.88
    assert totals["verdicts"] == {"corrected": 3, "reported": 1}


def test_every_format_carries_the_same_totals(
    journal_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """table, csv, json and html agree on the totals row and show the period."""
    base = ("--journal", str(journal_path), "--group-by", "tenant", "--since", "2026-11-01")
    as_json = json.loads(run(capsys, *base, "--format", "json"))["totals"]
    rows = list(csv.DictReader(io.StringIO(run(capsys, *base, "--format", "csv"))))
    assert rows[-1]["tenant"] == "TOTAL"
    assert int(rows[-1]["billed_tokens"]) == as_json["billed_tokens"] == 98
    assert rows[-1]["since"] == "2026-11-01T00:00:00+00:00"
    table = run(capsys, *base)
    assert "Usage from 2026-11-01T00:00:00+00:00 to now" in table
    total_line = [line for line in table.splitlines() if line.startswith("TOTAL")]
    assert total_line
    assert "98" in total_line[0]
    assert "141" in total_line[0]
    out = tmp_path / "r.html"
    run(capsys, *base, "--format", "html", "--output", str(out))
    page = out.read_text()
    assert '<tr class="total"><td title="TOTAL">TOTAL</td>' in page
    assert '<td class="n">98</td>' in page


def test_whole_range_grouped_by_day(journal_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without a range every record counts; --group-by day splits by UTC date."""
    rows = list(
        csv.DictReader(
            io.StringIO(
                run(capsys, "--journal", str(journal_path), "--format", "csv", "--group-by", "day")
            )
        )
    )
    assert [(r["day"], r["requests"], r["billed_tokens"]) for r in rows] == [
        ((NOW - timedelta(days=30)).date().isoformat(), "1", "18"),
        (NOW.date().isoformat(), "4", "98"),
        ("TOTAL", "5", "116"),
    ]


def test_unproven_tokens_are_called_out() -> None:
    """Tokens billed without proof (mismatch, unaudited) get their own column."""
    report = aggregate(
        [
            rec(1, "a", "/rerank", 57, 36),
            rec(2, "a", "/rerank", 57, 57, verdict="mismatch"),
            rec(3, "a", "/rerank", 40, 40, verdict="unaudited"),
        ],
        group_by=["tenant"],
    )
    assert report.rows[0].unproven_tokens == 97
    assert "Billed unproven" in as_table(report)


def test_long_tenant_names_stay_readable() -> None:
    """A 200-character tenant is shortened in the table (full name on hover in HTML)."""
    long = "tenant-" + "x" * 193
    report = aggregate([rec(1, long, "/rerank", 57, 36)], group_by=["tenant", "model"])
    table = as_table(report)
    assert max(len(line) for line in table.splitlines()) < 160
    assert long not in table
    page = as_html(report)
    assert f'title="{long}"' in page


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("today", "2026-11-30T00:00:00+00:00"),
        ("yesterday", "2026-11-29T00:00:00+00:00"),
        ("7d", "2026-11-23T12:00:00+00:00"),
        ("12h", "2026-11-30T00:00:00+00:00"),
        ("2026-11-01", "2026-11-01T00:00:00+00:00"),
        ("2026-11-01T10:00+02:00", "2026-11-01T08:00:00+00:00"),  # the instant, in UTC
    ],
)
def test_friendly_times(given: str, expected: str) -> None:
    """--since yesterday used to fail with Python's "Invalid isoformat string"."""
    from proxy.cli import _iso

    assert _iso(given, now=datetime(2026, 11, 30, 12, tzinfo=UTC)) == expected


def test_unreadable_time_is_a_clear_error(
    journal_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A --since the report cannot read exits 2 and says which forms it takes."""
    assert main(["report", "--journal", str(journal_path), "--since", "last tuesday"]) == 2
    assert "use ISO 8601" in capsys.readouterr().err


def test_missing_journal_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No journal at the path: exit 2 and say where it looked."""
    assert main(["report", "--journal", str(tmp_path / "none.sqlite")]) == 2
    assert "no journal at" in capsys.readouterr().err
