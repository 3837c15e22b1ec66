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
from proxy.ledger.report import aggregate
from proxy.ledger.report_formats import as_html, as_json, as_table

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
    """a: 57+57 reported, 36+36 billed (rerank), chat 5 prompt + 3 completion; b (in range):
    19/18; totals add up; the object names the period and when it was made."""
    report = json.loads(
        run(
            capsys,
            *("--journal", str(journal_path), "--format", "json", "--since", "2026-11-01"),
            *("--group-by", "tenant,operation"),
        )
    )
    assert report["since"] == "2026-11-01T00:00:00+00:00"
    assert report["until"] == report["generated_at"]
    assert report["group_by"] == ["tenant", "operation"]
    names = ("tenant", "operation", "requests", "prompt_tokens_reported")
    names += ("prompt_tokens_billed", "completion_tokens_reported", "completion_tokens_billed")
    got = [tuple(r[n] for n in names) for r in report["rows"]]
    assert got == [
        ("a", "chat", 1, 5, 5, 3, 3),
        ("a", "rerank", 2, 114, 72, 0, 0),
        ("b", "score", 1, 19, 18, 0, 0),
    ]
    totals = report["totals"]
    assert (totals["tenant"], totals["requests"]) == ("TOTAL", 4)
    assert (totals["prompt_tokens_reported"], totals["prompt_tokens_billed"]) == (138, 95)
    assert (totals["completion_tokens_reported"], totals["completion_tokens_billed"]) == (3, 3)
    assert totals["over_reported_tokens"] == 43
    assert totals["verdicts"] == {"corrected": 3, "reported": 1}


def test_csv_is_detail_rows_a_spreadsheet_can_sum(
    journal_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue #39 case 2: no TOTAL or subtotal row among the data (summing a column gave
    twice the total), and one integer column per verdict instead of a packed string."""
    base = ("--journal", str(journal_path), "--group-by", "tenant,day,operation")
    rows = list(csv.DictReader(io.StringIO(run(capsys, *base, "--format", "csv"))))
    totals = json.loads(run(capsys, *base, "--format", "json"))["totals"]
    assert [r["tenant"] for r in rows] == ["a", "a", "b", "b"]
    for column in ("requests", "prompt_tokens_billed", "completion_tokens_billed"):
        assert sum(int(r[column]) for r in rows) == totals[column]
    assert sum(int(r["verdict_corrected"]) for r in rows) == 4
    assert sum(int(r["verdict_reported"]) for r in rows) == 1
    assert "verdicts" not in rows[0]


def test_period_without_bounds_names_the_records_times(
    journal_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue #39 case 3: without --since/--until every format gives the first and last
    record's times, and since/until are filled in CSV and JSON (they were empty)."""
    base = ("--journal", str(journal_path), "--group-by", "tenant")
    first, last = (NOW - timedelta(days=30)).isoformat(), NOW.isoformat()
    report = json.loads(run(capsys, *base, "--format", "json"))
    assert (report["first_record"], report["last_record"]) == (first, last)
    assert report["since"] == first
    assert report["until"] == report["generated_at"]
    assert report["rows"][1]["first_record"] == first
    rows = list(csv.DictReader(io.StringIO(run(capsys, *base, "--format", "csv"))))
    assert (rows[0]["since"], rows[0]["first_record"], rows[0]["last_record"]) == (
        first,
        last,
        last,
    )
    assert rows[0]["until"]
    assert f"Usage (UTC) from {first} (first record) to " in run(capsys, *base)


def test_backwards_range_is_an_error(
    journal_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue #39 case 3: --since after --until printed an empty report with rc 0."""
    args = ["report", "--journal", str(journal_path), "--since", "2026-11-20"]
    assert main([*args, "--until", "2026-11-01"]) == 2
    err = capsys.readouterr().err
    assert "--since 2026-11-20" in err
    assert "is not before --until 2026-11-01" in err


def test_over_report_is_a_share_of_what_vllm_reported() -> None:
    """Issue #39 case 4: 97 over-reported of 239 reported is 40.59 %, not 97/142 = 68.31 %
    (a share of billed); the column says which."""
    report = aggregate([rec(1, "a", "/rerank", 239, 142)], group_by=["tenant"])
    assert json.loads(as_json(report))["totals"]["over_reported_pct"] == 40.59
    assert "Over-reported % of reported" in as_html(report)
    assert "Over-rep. %: over-reported tokens as a share of the reported" in as_table(report)


def test_per_tenant_subtotals(journal_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Grouped by tenant and more, each tenant's rows are followed by its subtotal (table,
    HTML, JSON's subtotals; none under a tenant of one row); the CSV stays detail only."""
    base = ("--journal", str(journal_path), "--group-by", "tenant,operation")
    subtotals = json.loads(run(capsys, *base, "--format", "json"))["subtotals"]
    assert [(s["tenant"], s["requests"], s["prompt_tokens_billed"]) for s in subtotals] == [
        ("a", 3, 77),
        ("b", 2, 36),
    ]
    table = run(capsys, *base).splitlines()
    at = next(i for i, line in enumerate(table) if line.startswith("a ") and "subtotal" in line)
    assert table[at - 1].startswith("a ")
    assert "rerank" in table[at - 1]
    assert table[at + 1].startswith("b ")
    assert not any(line.startswith("b ") and "subtotal" in line for line in table)
    two = [rec(1, "a", "/rerank", 5, 5), rec(2, "a", "/score", 5, 5)]
    assert '<tr class="subtotal">' in as_html(aggregate(two, group_by=["tenant", "operation"]))


def test_every_format_carries_the_same_totals(
    journal_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """table, json and html agree on the totals row and show the period."""
    base = ("--journal", str(journal_path), "--group-by", "tenant", "--since", "2026-11-01")
    as_json_ = json.loads(run(capsys, *base, "--format", "json"))["totals"]
    assert as_json_["prompt_tokens_billed"] == 95
    table = run(capsys, *base)
    assert "Usage (UTC) from 2026-11-01T00:00:00+00:00 to " in table
    total_line = [line for line in table.splitlines() if line.startswith("TOTAL")]
    assert total_line
    assert "95" in total_line[0]
    assert "138" in total_line[0]
    out = tmp_path / "r.html"
    run(capsys, *base, "--format", "html", "--output", str(out))
    page = out.read_text()
    assert '<tr class="total">\n<td class="key" title="TOTAL">TOTAL</td>' in page
    assert '<td class="n">95</td>' in page


def test_whole_range_grouped_by_day(journal_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without a range every record counts; --group-by day splits by UTC date."""
    rows = list(
        csv.DictReader(
            io.StringIO(
                run(capsys, "--journal", str(journal_path), "--format", "csv", "--group-by", "day")
            )
        )
    )
    assert [(r["day"], r["requests"], r["prompt_tokens_billed"]) for r in rows] == [
        ((NOW - timedelta(days=30)).date().isoformat(), "1", "18"),
        (NOW.date().isoformat(), "4", "95"),
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
    assert report.rows[0].unproven_prompt_tokens == 97
    assert "Unproven prompt" in as_table(report)


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
    from zoneinfo import ZoneInfo

    from proxy.reporting import instant

    assert instant(given, ZoneInfo("UTC"), now=datetime(2026, 11, 30, 12, tzinfo=UTC)) == expected


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


def test_a_journal_holding_version_2_records_reads_on(
    journal_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Journals are not migrated: a v2 body (no ``units``) stored beside v3 records is
    read as it was, its tokens counted, and the new unit columns are 0 for it."""
    import sqlite3

    with sqlite3.connect(journal_path) as db:
        stored = db.execute("SELECT body FROM records").fetchall()
        assert all('"units"' in body for (body,) in stored)
        # rewrite every stored body as a v2 proxy wrote it: no units, version 2
        for (body,) in stored:
            old = json.loads(body)
            del old["units"]
            old["schema_version"] = 2
            db.execute("UPDATE records SET body = ? WHERE body = ?", (json.dumps(old), body))
    args = ("--journal", str(journal_path), "--format", "json", "--since", "2026-11-01")
    totals = json.loads(run(capsys, *args))["totals"]
    assert (totals["requests"], totals["prompt_tokens_billed"]) == (4, 95)
    assert (totals["cached_prompt_tokens_billed"], totals["audio_seconds_billed"]) == (0, 0)


def test_budget_section_with_the_limits_file(
    journal_path: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Issue #38 "report shows budget use per tenant and period": with --limits, each
    budget's use in its period holding the report's end, in the table, JSON and HTML;
    the CSV keeps its detail rows only. a billed 77 prompt tokens in November (36+36+5),
    b 18 on the 20th (its October record is another month); a month ending at --until is
    November's."""
    limits = tmp_path / "limits.yaml"
    limits.write_text(
        "tenants:\n  a: {prompt_tokens_per_month: 100, requests_per_minute: 5}\n"
        "  b: {total_tokens_per_day: 20}\n"
    )
    base = ("--journal", str(journal_path), "--limits", str(limits), "--until", "2026-12-01")
    data = json.loads(run(capsys, *base, "--since", "2026-11-01", "--format", "json"))
    budgets = {(b["scope"], b["budget"]): b for b in data["budgets"] if "report end" in b["holds"]}
    assert list(budgets) == [("a", "prompt_tokens_per_month"), ("b", "total_tokens_per_day")]
    month = budgets["a", "prompt_tokens_per_month"]
    assert (month["used"], month["remaining"], month["used_percent"]) == (77, 23, 77.0)
    assert (month["period_start"], month["period_end"]) == (
        "2026-11-01T00:00+00:00",
        "2026-12-01T00:00+00:00",
    )
    assert budgets["b", "total_tokens_per_day"]["used"] == 0  # 30 November: no record
    late = json.loads(run(capsys, *base, "--since", "2026-11-20T12:30", "--format", "json"))
    assert late["budgets"][0]["holds"] == ["report end"]
    assert late["budgets"][0]["used"] == 77  # the month is read whole, whatever --since says
    table = run(capsys, *base, "--format", "table")
    assert "prompt_tokens_per_month" in table
    assert "Budgets" in table
    assert "Budgets" in run(capsys, *base, "--format", "html")
    assert "prompt_tokens_per_month" not in run(capsys, *base, "--format", "csv")
    day = json.loads(
        run(
            capsys,
            "--journal",
            str(journal_path),
            "--limits",
            str(limits),
            "--until",
            "2026-11-20T13:00",
            "--format",
            "json",
        )
    )["budgets"]
    day = next(b for b in day if b["scope"] == "b" and "report end" in b["holds"])
    assert (day["scope"], day["used"], day["remaining"]) == ("b", 18, 2)


def test_a_bad_limits_file_is_one_clear_line(
    journal_path: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A limits file that does not parse or validate exits 2 with its name, no traceback."""
    bad = tmp_path / "limits.yaml"
    for text in ("tenants: [", "tenants: {a: {tokens_per_year: 5}}"):
        bad.write_text(text)
        assert main(["report", "--journal", str(journal_path), "--limits", str(bad)]) == 2
        err = capsys.readouterr().err
        assert f"--limits {bad} is not a valid limits file" in err
        assert "Traceback" not in err


# A price change in the middle of November, in the middle of a day.


def test_a_bad_price_file_is_one_clear_line(
    journal_path: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A price file that does not validate exits 2 naming it and each problem's place."""
    bad = tmp_path / "prices.yaml"
    bad.write_text("currency: USD\nmodels: {chat: {prompt_tokens: '-1', image_tokens: '1'}}\n")
    assert main(["report", "--journal", str(journal_path), "--prices", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"--prices {bad} is not a valid price file: " in err
    assert "models.chat.0: unknown unit 'image_tokens'" in err
    assert "models.chat.0.prompt_tokens: -1 is negative" in err
    assert len(err.strip().splitlines()) == 1


def test_days_are_the_reports_zones() -> None:
    """Issue #54 item 1: grouped by day, a record at 23:30 UTC on 30 November is on
    1 December in Paris, and the day column names its zone."""
    from zoneinfo import ZoneInfo

    late = rec(1, "a", "/rerank", 57, 36, when=datetime(2026, 11, 30, 23, 30, tzinfo=UTC))
    paris = aggregate([late], group_by=["day"], zone=ZoneInfo("Europe/Paris"))
    assert [r.keys["day"] for r in paris.rows] == ["2026-12-01"]
    assert "Day (Europe/Paris)" in as_table(paris)
    assert [r.keys["day"] for r in aggregate([late], group_by=["day"]).rows] == ["2026-11-30"]
