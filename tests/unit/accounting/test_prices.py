"""Prices in force: a record's lines at its price (cached tokens apart only when they have
a price), a reservation's bound, and exact sums; a table's rate at an instant."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from proxy.accounting.prices import PriceTable, Rate
from proxy.accounting.units import Quantities, Unit

JAN, MID = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 11, 15, 11, tzinfo=UTC)


def per_token(price: str) -> tuple[tuple[Unit, Decimal], ...]:
    return ((Unit.PROMPT, Decimal(price)),)


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
            (Unit.PROMPT, Decimal(2)),
            (Unit.CACHED, Decimal(1)),
            (Unit.COMPLETION, Decimal(3)),
        ),
    )
    plain = Rate(None, None, ((Unit.PROMPT, Decimal(2)), (Unit.COMPLETION, Decimal(3))))
    said = [[(x.unit, x.quantity, x.amount) for x in r.lines(q) or ()] for r in (priced, plain)]
    assert said == [
        [
            (Unit.PROMPT, 60, Decimal(120)),
            (Unit.CACHED, 40, Decimal(40)),
            (Unit.COMPLETION, 10, Decimal(30)),
        ],
        [(Unit.PROMPT, 100, Decimal(200)), (Unit.COMPLETION, 10, Decimal(30))],
    ]


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
            (Unit.PROMPT, Decimal("1.5e-7")),
            (Unit.CACHED, Decimal("5.46875e-8")),
            (Unit.COMPLETION, Decimal("6e-7")),
        ),
    )
    cached = min(cached, p1)
    one, two = Quantities(p1, c1, cached), Quantities(p2, c2)
    both = Quantities(p1 + p2, c1 + c2, cached)
    lines = [rate.lines(q) or () for q in (one, two, both)]
    total = [sum((line.amount for line in x), Decimal(0)) for x in lines]
    assert total[0] + total[1] == total[2]
    assert all(line.amount == line.quantity * line.price for x in lines for line in x)


def test_the_most_a_reservation_costs_needs_every_unit_it_holds_priced() -> None:
    """Each unit at its price (prompt tokens at the dearer of prompt and cached); a unit
    it holds without a price: None, and ``unpriced`` names it."""
    rate = Rate(None, None, ((Unit.PROMPT, Decimal(1)), (Unit.CACHED, Decimal(3))))
    assert rate.most(Quantities(prompt_tokens=10)) == Decimal(30)
    assert rate.most(Quantities(prompt_tokens=10, audio_seconds=2)) is None
    assert rate.unpriced(Quantities(completion_tokens=1, audio_seconds=2)) == [
        Unit.COMPLETION,
        Unit.AUDIO,
    ]
    seconds = Rate(None, None, ((Unit.AUDIO, Decimal("0.05")),))
    assert seconds.most(Quantities(audio_seconds=3600)) == Decimal(180)
    assert seconds.most(Quantities()) == Decimal(0)


def test_the_rates_over_a_stretch_and_the_gaps_ahead() -> None:
    """Every rate in force from a start to an end (both included), None where an instant
    of it has none; a gap is an end before the next start, found only ahead."""
    later = datetime(2026, 12, 1, tzinfo=UTC)
    rates = (
        Rate(JAN, MID, per_token("1")),
        Rate(MID, later, per_token("2")),
        Rate(datetime(2026, 12, 2, tzinfo=UTC), None, per_token("3")),
    )
    table = PriceTable("USD", 2, {"chat": rates})
    assert table.over("chat", JAN, MID) == list(rates[:2])
    assert table.over("chat", JAN, JAN) == [rates[0]]
    assert table.over("chat", MID, later) is None  # up to the gap's first instant
    assert table.gap("chat", JAN) == (later, datetime(2026, 12, 2, tzinfo=UTC))
    assert table.gap("chat", datetime(2026, 12, 3, tzinfo=UTC)) is None
    assert table.gap("other", JAN) is None
