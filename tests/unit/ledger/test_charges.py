"""The report's amounts: each record re-priced at the price in force at its time, lines
exact, each tenant's amount rounded once; records that cannot be priced are counted."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.accounting.price_schedule import PriceFile
from proxy.accounting.prices import PriceTable
from proxy.accounting.units import Unit
from proxy.ledger.charges import charge
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
