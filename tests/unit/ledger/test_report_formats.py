"""The report's formats: prompt and completion apart in each, an escaped HTML page that
says what its columns mean, readable long names."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime

from proxy.accounting.routes import BY_PATH
from proxy.ledger.records import UsageRecord
from proxy.ledger.report import COLUMNS, aggregate
from proxy.ledger.report_formats import as_csv, as_html, as_json, as_table


def rec(
    i: int,
    tenant: str,
    endpoint: str,
    reported: int,
    billed: int,
    completion: int = 0,
    verdict: str = "corrected",
) -> UsageRecord:
    return UsageRecord(
        client_request_id=f"r{i}",
        time=datetime(2026, 11, 20, 12, 0, tzinfo=UTC),
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


def test_prompt_and_completion_are_never_added() -> None:
    """Issue #39 case 1: a chat row of 40 prompt + 48 completion tokens shows 40 and 48 in
    their own columns in every format, never 88 in one "billed" figure."""
    report = aggregate([rec(1, "a", "/v1/chat/completions", 40, 40, 48, "reported")])
    data = json.loads(as_json(report))["rows"][0]
    assert (data["prompt_tokens_billed"], data["completion_tokens_billed"]) == (40, 48)
    assert "billed_tokens" not in data
    row = next(csv.DictReader(io.StringIO(as_csv(report))))
    assert (row["prompt_tokens_billed"], row["completion_tokens_billed"]) == ("40", "48")
    assert "88" not in as_table(report)
    assert "88" not in as_html(report)


def test_html_escapes_and_explains_its_columns() -> None:
    """The page is rendered by an autoescaping template (issue #43 item 5): a tenant name
    with markup is text, and every column's meaning is written out."""
    report = aggregate([rec(1, "<script>x</script>", "/rerank", 57, 36)], group_by=["tenant"])
    page = as_html(report)
    assert "<script>" not in page
    assert "&lt;script&gt;x&lt;/script&gt;" in page
    for column in COLUMNS:
        assert f"<dt>{column.title}</dt><dd>{column.meaning}</dd>".replace("'", "&#39;") in page


def test_long_tenant_names_stay_readable() -> None:
    """A 200-character tenant is shortened in the table (full name on hover in HTML)."""
    long = "tenant-" + "x" * 193
    report = aggregate([rec(1, long, "/rerank", 57, 36)], group_by=["tenant", "model"])
    table = as_table(report)
    assert max(len(line) for line in table.splitlines()) < 200
    assert long not in table
    page = as_html(report)
    assert f'title="{long}"' in page


def test_one_column_per_unit_in_every_format() -> None:
    """Cached prompt tokens and audio seconds have their own columns, summed per row and in
    the totals, never folded into the token figures; the CSV stays detail rows only."""
    chat = rec(1, "a", "/v1/chat/completions", 40, 40, 8, "reported").model_dump()
    cached = UsageRecord(**{**chat, "units": {"cached_prompt_tokens": 32}})
    fields = {**chat, "client_request_id": "r2", "prompt_tokens_reported": None}
    fields |= {"prompt_tokens_billed": None, "completion_tokens_reported": None}
    audio = UsageRecord(
        **{**fields, "completion_tokens_billed": None, "units": {"audio_seconds": 8}}
    )
    old = rec(3, "a", "/v1/chat/completions", 10, 10)
    report = aggregate([cached, audio, old, audio])
    assert [c.name for c in COLUMNS][-2:] == ["cached_prompt_tokens_billed", "audio_seconds_billed"]
    data = json.loads(as_json(report))
    assert data["totals"]["cached_prompt_tokens_billed"] == 32
    assert data["totals"]["audio_seconds_billed"] == 16
    assert data["totals"]["prompt_tokens_billed"] == 50
    rows = list(csv.DictReader(io.StringIO(as_csv(report))))
    assert len(rows) == 1  # one detail row (a, minilm, chat); no totals row
    assert (rows[0]["cached_prompt_tokens_billed"], rows[0]["audio_seconds_billed"]) == ("32", "16")
    assert "Audio s" in as_table(report)
    assert "Audio seconds billed" in as_html(report)


def test_csv_never_starts_a_formula_from_a_name() -> None:
    """A model or tenant name is text the client or operator chose: one that begins like a
    spreadsheet formula (``=``, ``+``, ``-``, ``@``, tab, carriage return) is written with a
    leading apostrophe, so opening the CSV in a spreadsheet never evaluates it (OWASP's CSV
    injection rule); the figures stay plain numbers a spreadsheet can sum."""
    names = ['=HYPERLINK("http://x")', "+1+1", "-2+3", "@SUM(A1)", "\tx", "\rx", "plain"]
    records = [
        UsageRecord(**{**rec(i, name, "/rerank", 57, 36).model_dump(), "model": name})
        for i, name in enumerate(names)
    ]
    rows = list(csv.DictReader(io.StringIO(as_csv(aggregate(records)))))
    assert {r["tenant"] for r in rows} == {"'" + n for n in names[:-1]} | {"plain"}
    assert {r["model"] for r in rows} == {"'" + n for n in names[:-1]} | {"plain"}
    assert {r["prompt_tokens_billed"] for r in rows} == {"36"}


def test_table_shows_control_characters_as_escapes() -> None:
    """A name with terminal control sequences (an ANSI escape, a newline) cannot rewrite the
    operator's terminal or forge a row of the text table: they are shown escaped."""
    name = "evil\x1b[2J\x1b[31mred\nforged-row\x07"
    report = aggregate([rec(1, name, "/rerank", 57, 36)], group_by=["tenant"])
    table = as_table(report)
    assert "\x1b" not in table
    assert "\x07" not in table
    assert [line for line in table.splitlines() if "evil" in line or "forged" in line] == [
        line for line in table.splitlines() if "evil" in line and "forged" in line
    ]
    assert "\\x1b" in table


def month_of_many_tenants() -> list[UsageRecord]:
    """A month's worth of figures as wide as they come: long names, ten-digit counts,
    every verdict, cached tokens and audio seconds."""
    from proxy.ledger.records import Units

    verdicts = ("corrected", "exact", "reported", "mismatch", "unaudited", "invalid")
    tenants = ("acme-corporation-production", "globex", "initech-research-and-development")
    endpoints = ("/rerank", "/v1/chat/completions", "/v1/embeddings", "/score")
    out = []
    for i in range(48):
        chat = endpoints[i % 4] == "/v1/chat/completions"
        record = rec(i, tenants[i % 3], endpoints[i % 4], 1_234_567_890 + i, 1_000_000_000 + i)
        units = Units(
            prompt_tokens=record.prompt_tokens_billed,
            completion_tokens=987_654_321 if chat else 0,
            cached_prompt_tokens=512_000_000 if chat else None,
            audio_seconds=3_600_000 if i % 5 == 0 else None,
        )
        model = "multilingual-e5-small-instruct" if i % 2 else "bge-reranker-v2-m3"
        out.append(
            record.model_copy(
                update={
                    "verdict": verdicts[i % 6],
                    "model": model,
                    "completion_tokens_reported": 987_654_321 if chat else 0,
                    "completion_tokens_billed": 987_654_321 if chat else 0,
                    "units": units,
                }
            )
        )
    return out


def test_the_html_page_fits_1400_px_in_chromium() -> None:
    """Issue #54 item 7, seen in headless Chromium at 1,400 px: the last columns of the
    usage table were cut off and the column meanings slid off their names (a long name
    took two lines, its meaning stayed on one, and every meaning after it sat beside the
    wrong name). Now the figures come in two tables (tokens; proof, other units and
    verdicts), no header cell of any table ends beyond the window even with ten-digit
    counts, nothing scrolls sideways, and each meaning is on its name's line."""
    from proxy.ledger.report import BudgetRow
    from tests.support.chromium import layout

    report = aggregate(month_of_many_tenants(), since="2026-11-01T00:00:00+01:00")
    report.budgets = (
        BudgetRow(
            "acme-corporation-production",
            "total_tokens_per_month",
            "2026-11-01T00:00+01:00",
            "2026-12-01T00:00+01:00",
            2_940_000_000,
            3_000_000_000,
            ("report end", "now"),
        ),
    )
    found = layout(as_html(report), 1400)
    assert found["width"] <= 1400
    assert found["page"] <= found["width"]  # nothing beyond the window
    tokens, proof, budgets = found["tables"]
    assert tokens["columns"] + proof["columns"] == 2 * 3 + len(COLUMNS) + 1  # and verdicts
    for table in (tokens, proof, budgets):
        assert (table["cut"], table["scrolls"]) == ([], False)
    assert [t["term"] for t in found["terms"]] == [c.title for c in COLUMNS] + ["Verdicts"]
    assert [t for t in found["terms"] if t["offset"] > 1] == []
