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
