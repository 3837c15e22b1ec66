"""The --prices file reloaded in place: a valid file replaces the table whole; a bad one,
or one that leaves a budgeted model without a price, is one log line and a count, and the
table in use stays. The spend metrics price each record at its time."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from proxy.accounting.prices import PriceTable
from proxy.ledger.records import Units, UsageRecord
from proxy.metrics import Metrics
from proxy.serving.pricesfile import Prices, PricesFile, read_table
from proxy.settings import Settings

GOOD = "currency: USD\nmodels: {chat: {prompt_tokens: '0.000001', completion_tokens: '0.000002'}}\n"
BAD = {
    "unknown unit": "currency: USD\ndefault: {image_tokens: '1'}\n",
    "negative": "currency: USD\ndefault: {prompt_tokens: '-1'}\n",
    "not a number": "currency: USD\ndefault: {prompt_tokens: free}\n",
    "overlaps": (
        "currency: USD\nmodels:\n  chat:\n"
        "    - {from: 2026-01-01, until: 2026-03-01, prompt_tokens: '1'}\n"
        "    - {from: 2026-02-01, prompt_tokens: '2'}\n"
    ),
    "while parsing": "currency: [\n",
}


def metrics(**options: object) -> Metrics:
    return Metrics(Settings(upstream="http://x", **options))  # type: ignore[arg-type]


def no_price_for_rerank(table: PriceTable) -> str | None:
    """As the app's check does for a tenant-wide budget while 'rerank' is served."""
    if table.rate("rerank", datetime.now(UTC)) is None:
        return "no price in force for 'rerank', while a cost_per_* budget applies to it"
    return None


@pytest.mark.parametrize("why", [*BAD, "a budgeted model without a price"])
def test_a_bad_file_keeps_the_table_in_use_and_says_why_in_one_line(
    why: str, tmp_path: Path
) -> None:
    """An unknown unit, a negative or non-numeric price, overlapping dates, broken YAML,
    or a model a money budget applies to left without a price: the reload fails with one
    clear log line and a count; the table in use stays."""
    path = tmp_path / "prices.yaml"
    path.write_text("currency: USD\nmodels: {rerank: {prompt_tokens: '1'}}\n")
    m = metrics()
    prices = Prices(read_table(path), m)
    before = prices.table
    file = PricesFile(path, prices, m, check=no_price_for_rerank)
    path.write_text(BAD.get(why, GOOD))
    with capture_logs() as logs:
        assert not file.reload("test")
    (line,) = logs
    assert line["event"] == "prices_reload_failed"
    assert "\n" not in line["error"]
    assert (why if why in BAD else "'rerank'") in line["error"]
    assert prices.table is before
    assert m.prices_reload_failures._value.get() == 1


def test_a_good_file_replaces_the_table(tmp_path: Path) -> None:
    """A valid file is in use after the reload, whole."""
    path = tmp_path / "prices.yaml"
    path.write_text(GOOD)
    prices = Prices(read_table(path), metrics())
    file = PricesFile(path, prices, metrics())
    path.write_text("currency: EUR\ndefault: {prompt_tokens: '0.5'}\n")
    assert file.reload("test")
    assert prices.table.currency == "EUR"


def test_a_model_served_since_without_a_price_is_said_once(tmp_path: Path) -> None:
    """The watch logs a problem the first time it sees it, not at every poll."""
    path = tmp_path / "prices.yaml"
    path.write_text(GOOD)
    file = PricesFile(
        path, Prices(read_table(path), metrics()), metrics(), check=no_price_for_rerank
    )
    with capture_logs() as logs:
        assert file.unpriced() is not None
        assert file.unpriced() is not None
    assert [line["event"] for line in logs] == ["prices_missing"]


def record(model: str, prompt: int, completion: int = 0, audio: int = 0) -> UsageRecord:
    return UsageRecord(
        time=datetime(2026, 11, 20, tzinfo=UTC),
        tenant="acme",
        model=model,
        endpoint="/v1/chat/completions",
        operation="chat",
        prompt_tokens_billed=prompt,
        completion_tokens_billed=completion,
        status=200,
        latency_ms=1.0,
        instance="t",
        units=Units(
            prompt_tokens=prompt, completion_tokens=completion, audio_seconds=audio or None
        ),
    )


def test_spend_per_tenant_and_model(tmp_path: Path) -> None:
    """Each record's amount at its time, by model, currency and tenant; a record that
    cannot be priced is counted apart, never as zero spend."""
    path = tmp_path / "prices.yaml"
    path.write_text(GOOD)
    m = metrics(admin_port=9999, metrics_tenant_label=True)
    prices = Prices(read_table(path), m)
    prices.account(record("chat", 1000, 500))
    prices.account(record("chat", 1000, 0, audio=3))
    prices.account(record("chat", 0))
    page = m.render().decode()
    assert 'usage_proxy_spend_total{currency="USD",model="chat",tenant="acme"} 0.002' in page
    assert 'usage_proxy_unpriced_records_total{model="chat",tenant="acme"} 1.0' in page
