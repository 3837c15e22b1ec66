"""Prices in force: a record's lines at its price (cached tokens apart only when they have
a price), a reservation's bound, and exact sums; a table's rate at an instant."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from proxy.accounting.prices import PricedUnit, PriceTable, Quantities, Rate

JAN, MID = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 11, 15, 11, tzinfo=UTC)


def per_token(price: str) -> tuple[tuple[PricedUnit, Decimal], ...]:
    return ((PricedUnit.PROMPT, Decimal(price)),)


def test_a_table_gives_the_rate_in_force() -> None:
    """A model's own rates replace the default's for it (before its first, none); any
    other model gets the default's; a rate runs from its start (inclusive) to its end;
    a record's billionths are rounded up; the cuts are every start and end."""
    own = (Rate(JAN, MID, per_token("1.5e-7")), Rate(MID, None, per_token("2e-7")))
    table = PriceTable("USD", 2, {None: (Rate(None, None, per_token("1")),), "chat": own})
    assert table.rate("chat", MID) is own[1]
    assert table.rate("chat", MID.replace(microsecond=1)) is own[1]
    assert table.rate("chat", datetime(2026, 11, 15, 10, 59, 59, tzinfo=UTC)) is own[0]
    assert table.rate("chat", datetime(2025, 6, 1, tzinfo=UTC)) is None
    assert table.rate("rerank", MID) is table.rates[None][0]
    assert table.nanos("chat", Quantities(prompt_tokens=3), JAN) == 450
    assert table.nanos("chat", Quantities(prompt_tokens=1), MID) == 200
    assert table.nanos("chat", Quantities(audio_seconds=1), MID) is None
    assert table.cuts() == [JAN, MID]


def test_cached_tokens_are_priced_apart_only_when_they_have_a_price() -> None:
    """With a cached price, the prompt line holds the others; without one, every prompt
    token is a prompt token."""
    q = Quantities(prompt_tokens=100, completion_tokens=10, cached_prompt_tokens=40)
    priced = Rate(
        None,
        None,
        (
            (PricedUnit.PROMPT, Decimal(2)),
            (PricedUnit.CACHED, Decimal(1)),
            (PricedUnit.COMPLETION, Decimal(3)),
        ),
    )
    plain = Rate(None, None, ((PricedUnit.PROMPT, Decimal(2)), (PricedUnit.COMPLETION, Decimal(3))))
    said = [[(x.unit, x.quantity, x.amount) for x in r.lines(q) or ()] for r in (priced, plain)]
    assert said == [
        [
            (PricedUnit.PROMPT, 60, Decimal(120)),
            (PricedUnit.CACHED, 40, Decimal(40)),
            (PricedUnit.COMPLETION, 10, Decimal(30)),
        ],
        [(PricedUnit.PROMPT, 100, Decimal(200)), (PricedUnit.COMPLETION, 10, Decimal(30))],
    ]


def test_the_reservation_bound_takes_the_dearer_prompt_price() -> None:
    """Which prompt tokens the cache serves is known only after: each is reserved at the
    dearer price; a unit without a price reserves nothing."""
    rate = Rate(None, None, ((PricedUnit.PROMPT, Decimal(1)), (PricedUnit.CACHED, Decimal(3))))
    assert rate.bound(10, 5) == Decimal(30)


@given(
    st.integers(0, 10**6),
    st.integers(0, 10**6),
    st.integers(0, 10**6),
    st.integers(0, 10**6),
    st.integers(0, 10**6),
)
def test_pricing_adds_up(p1: int, c1: int, p2: int, c2: int, cached: int) -> None:
    """Two records priced apart cost what their sum costs (no rounding inside a record),
    and each line is its quantity times its price, exactly."""
    rate = Rate(
        None,
        None,
        (
            (PricedUnit.PROMPT, Decimal("1.5e-7")),
            (PricedUnit.CACHED, Decimal("5.46875e-8")),
            (PricedUnit.COMPLETION, Decimal("6e-7")),
        ),
    )
    cached = min(cached, p1)
    one, two = Quantities(p1, c1, cached), Quantities(p2, c2)
    both = Quantities(p1 + p2, c1 + c2, cached)
    lines = [rate.lines(q) or () for q in (one, two, both)]
    total = [sum((line.amount for line in x), Decimal(0)) for x in lines]
    assert total[0] + total[1] == total[2]
    assert all(line.amount == line.quantity * line.price for x in lines for line in x)
