"""The report's amounts: each record re-priced at the price in force at its time, lines
exact, each tenant's amount rounded once (as every format of ``usage-proxy report`` states
it, and a money budget's use in its currency); records that cannot be priced are counted."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.accounting.price_schedule import PriceFile
from proxy.accounting.prices import PriceTable
from proxy.accounting.units import Unit
from proxy.cli import main
from proxy.ledger.charges import charge
from proxy.ledger.journal import Journal
from proxy.ledger.records import Units, UsageRecord

CHANGE = datetime(2026, 11, 15, 12, 30, tzinfo=UTC)  # mid-month, mid-day
OLD, NEW = Decimal("0.0000015"), Decimal("0.0000021")
COMPLETION = Decimal("0.000006")


def prices() -> PriceTable:
    return PriceFile.model_validate(
        {
            "currency": "USD",
            "models": {
                "chat": [
                    {
                        "from": "2026-11-01",
                        "prompt_tokens": str(OLD),
                        "completion_tokens": str(COMPLETION),
                    },
                    {
                        "from": CHANGE.isoformat(),
                        "prompt_tokens": str(NEW),
                        "completion_tokens": str(COMPLETION),
                    },
                ]
            },
        }
    ).table()


def record(
    tenant: str,
    when: datetime,
    prompt: int,
    completion: int = 0,
    model: str = "chat",
    **units: int,
) -> UsageRecord:
    return UsageRecord(
        time=when,
        tenant=tenant,
        model=model,
        endpoint="/v1/chat/completions",
        operation="chat",
        prompt_tokens_reported=prompt,
        prompt_tokens_billed=prompt,
        completion_tokens_reported=completion,
        completion_tokens_billed=completion,
        verdict="reported",
        status=200,
        latency_ms=1.0,
        instance="t",
        units=Units(prompt_tokens=prompt, completion_tokens=completion, **units),
    )


def by_tenant(r: UsageRecord) -> tuple[str, ...]:
    return (r.tenant,)


def test_a_price_change_mid_month_prices_each_record_at_its_time() -> None:
    """One line per price; the record a microsecond before the change pays the old price,
    the one at it the new; the tenant's amount is rounded once, half to even."""
    records = [
        record("acme", CHANGE - timedelta(microseconds=1), 1000, 10),
        record("acme", CHANGE, 3000),
        record("acme", CHANGE + timedelta(days=3), 2333),
    ]
    charges = charge(records, prices(), by_tenant)
    said = [(c.unit, c.since, c.price, c.quantity, c.amount) for c in charges.lines]
    assert said == [
        (Unit.PROMPT, datetime(2026, 11, 1, tzinfo=UTC), OLD, 1000, Decimal("0.0015")),
        (Unit.PROMPT, CHANGE, NEW, 5333, Decimal("0.0111993")),
        (
            Unit.COMPLETION,
            datetime(2026, 11, 1, tzinfo=UTC),
            COMPLETION,
            10,
            Decimal("0.00006"),
        ),
    ]
    (acme,) = charges.tenants
    assert acme.amount == Decimal("0.0127593")
    assert acme.due == Decimal("0.01")
    assert charges.rows[("acme",)].units[Unit.PROMPT] == Decimal("0.0126993")


def test_what_cannot_be_priced_is_counted_never_priced_at_zero() -> None:
    """A record before any price, of a model without one, or with a unit without a
    price: counted as unpriced and left out; one that billed nothing needs no price."""
    records = [
        record("acme", datetime(2026, 10, 1, tzinfo=UTC), 100),
        record("acme", CHANGE, 100, model="other"),
        record("acme", CHANGE, 100, audio_seconds=3),
        record("acme", CHANGE, 0),
        record("acme", CHANGE, 100),
    ]
    charges = charge(records, prices(), by_tenant)
    (acme,) = charges.tenants
    assert acme.unpriced == 3
    assert acme.amount == 100 * NEW
    assert charges.unpriced == 3


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["acme", "bob"]),
            st.integers(-20 * 86400, 20 * 86400),
            st.integers(0, 10**6),
            st.integers(0, 10**5),
        ),
        max_size=40,
    )
)
def test_a_tenants_due_is_its_records_priced_at_their_time_rounded_once(
    rows: list[tuple[str, int, int, int]],
) -> None:
    """Whatever the records, a tenant's amount is the sum of each record's units times
    the price at its time, exactly, and its due that sum rounded once to the cent."""
    records = [record(t, CHANGE + timedelta(seconds=s), p, c) for t, s, p, c in rows]
    charges = charge(records, prices(), by_tenant)
    for tenant in charges.tenants:
        mine = [r for r in records if r.tenant == tenant.tenant]
        exact = sum(
            (
                (r.prompt_tokens_billed or 0) * (OLD if r.time < CHANGE else NEW)
                + (r.completion_tokens_billed or 0) * COMPLETION
                for r in mine
                if r.time >= datetime(2026, 11, 1, tzinfo=UTC)
            ),
            Decimal(0),
        )
        assert tenant.amount == exact
        assert tenant.due == exact.quantize(Decimal("0.01"), rounding=ROUND_HALF_EVEN)
    assert charges.due == sum((t.due for t in charges.tenants), Decimal(0))


PRICES = f"""
currency: USD
models:
  chat:
    - {{from: 2026-11-01, prompt_tokens: "0.000001", completion_tokens: "0.000005"}}
    - from: {CHANGE.isoformat()}
      prompt_tokens: "0.000002"
      cached_prompt_tokens: "0.0000005"
      completion_tokens: "0.000005"
"""


def price_at(when: datetime, prompt: int, completion: int, cached: int) -> Decimal:
    """The hand-written rule the report must agree with."""
    if when < CHANGE:
        return prompt * Decimal("0.000001") + completion * Decimal("0.000005")
    return (
        (prompt - cached) * Decimal("0.000002")
        + cached * Decimal("0.0000005")
        + completion * Decimal("0.000005")
    )


MID_MONTH = [
    # "even": 0.025 before the change, 0.1 at its very instant: 0.125, half to even 0.12
    record("even", CHANGE - timedelta(microseconds=1), 25_000, 0, cached_prompt_tokens=0),
    record("even", CHANGE, 50_000, 0, cached_prompt_tokens=0),
    record("acme", datetime(2026, 11, 2, 8, tzinfo=UTC), 123_457, 8_765, cached_prompt_tokens=0),
    record(
        "acme", datetime(2026, 11, 14, 23, 59, tzinfo=UTC), 98_765, 4_321, cached_prompt_tokens=0
    ),
    record(
        "acme", datetime(2026, 11, 16, 1, tzinfo=UTC), 77_777, 3_333, cached_prompt_tokens=55_555
    ),
    record("acme", datetime(2026, 11, 29, 17, tzinfo=UTC), 11_111, 2_222, cached_prompt_tokens=0),
    record(
        "acme", datetime(2026, 12, 1, tzinfo=UTC), 10**6, 0, cached_prompt_tokens=0
    ),  # after --until
]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["report", *args]) == 0
    return capsys.readouterr().out


def dues_of(fmt: str, text: str) -> dict[str, Decimal]:
    """Each tenant's amount due as the format states it."""
    if fmt == "json":
        return {t["tenant"]: Decimal(t["due"]) for t in json.loads(text)["charges"]["tenants"]}
    if fmt == "csv":
        return {
            r["tenant"]: Decimal(r["tenant_amount_due"]) for r in csv.DictReader(io.StringIO(text))
        }
    if fmt == "html":
        rows = re.findall(
            r'<tr><td>([a-z]+)</td><td class="n">[0-9.]+</td><td class="n">([0-9.]+)</td>', text
        )
        return {tenant: Decimal(due) for tenant, due in rows}
    dues = text.split("Unpriced requests", 1)[1]
    return {
        m[0]: Decimal(m[1])
        for m in re.findall(r"^([a-z]+)\s+[0-9.]+\s+([0-9.]+)\s+\d+$", dues, re.M)
    }


@pytest.mark.parametrize("fmt", ["table", "csv", "json", "html"])
async def test_amounts_across_a_price_change_to_the_cent_in_every_format(
    fmt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A price change mid-month: each tenant's amount is the sum of each record's units
    times the price in force at its time, rounded once to the cent (half to even), as
    every format states it; the CSV's exact row amounts add up to it."""
    path = tmp_path / "j.sqlite"
    journal = Journal(path)
    await journal.open()
    for r in MID_MONTH:
        await journal.append(r)
    await journal.close()
    prices = tmp_path / "prices.yaml"
    prices.write_text(PRICES)
    window = ("--since", "2026-11-01", "--until", "2026-12-01")
    text = run(capsys, "--journal", str(path), "--prices", str(prices), *window, "--format", fmt)
    expected = {}
    for tenant in ("acme", "even"):
        exact = sum(
            (
                price_at(
                    r.time,
                    r.units.prompt_tokens or 0,
                    r.units.completion_tokens or 0,
                    r.units.cached_prompt_tokens or 0,
                )
                for r in MID_MONTH
                if r.tenant == tenant and r.time < datetime(2026, 12, 1, tzinfo=UTC)
            ),
            Decimal(0),
        )
        expected[tenant] = exact.quantize(Decimal("0.01"), rounding=ROUND_HALF_EVEN)
    assert expected["even"] == Decimal("0.12")
    assert dues_of(fmt, text) == expected
    if fmt == "csv":
        rows = list(csv.DictReader(io.StringIO(text)))
        acme = sum(Decimal(r["amount"]) for r in rows if r["tenant"] == "acme")
        assert acme.quantize(Decimal("0.01"), rounding=ROUND_HALF_EVEN) == expected["acme"]


async def test_a_money_budget_is_reported_in_its_currency(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--limits`` with a ``cost_per_month`` shows its use as admission bills it, in the
    price file's currency; without ``--prices`` the report says what is missing."""
    path = tmp_path / "j.sqlite"
    journal = Journal(path)
    await journal.open()
    for r in MID_MONTH[:2]:
        await journal.append(r)
    await journal.close()
    prices, limits = tmp_path / "prices.yaml", tmp_path / "limits.yaml"
    prices.write_text(PRICES)
    limits.write_text("tenants: {even: {cost_per_month: '0.5'}}\n")
    base = ("--journal", str(path), "--limits", str(limits), "--until", "2026-11-30")
    report = json.loads(run(capsys, *base, "--prices", str(prices), "--format", "json"))
    (budget,) = [b for b in report["budgets"] if "report end" in b["holds"]]  # November's
    assert budget["budget"] == "cost_per_month"
    assert (budget["used"], budget["amount"], budget["remaining"]) == ("0.125", "0.5", "0.375")
    assert (budget["currency"], budget["used_percent"]) == ("USD", 25.0)
    assert "0.125" in run(capsys, *base, "--prices", str(prices))
    assert main(["report", *base]) == 2
    assert "has cost_per_* budgets: give --prices too" in capsys.readouterr().err
