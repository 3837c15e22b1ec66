"""Money: amounts are the decimals written (never floats), a limiter's billionths never
count less than was spent, and an invoice rounds once, half to even."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.accounting.money import (
    NANOS,
    amount,
    decimals_of,
    due,
    from_nanos,
    nanos_up,
    plain,
    read_yaml,
)

AMOUNTS = st.decimals(min_value=0, max_value=10**6, places=12, allow_nan=False)


@pytest.mark.parametrize(
    ("written", "read"),
    [
        ("250.00", Decimal("250.00")),
        (" 0.0000002 ", Decimal("0.0000002")),
        (7, Decimal(7)),
        ("3e-08", Decimal("3E-8")),
        (Decimal("1.5E-7"), Decimal("1.5E-7")),
        ("-0", Decimal(0)),
    ],
)
def test_an_amount_is_the_decimal_written(written: object, read: Decimal) -> None:
    """Strings, integers and Decimals are read exactly (a negative zero is zero)."""
    assert amount(written) == read
    assert not amount(written).is_signed()


@pytest.mark.parametrize(
    ("written", "why"),
    [
        (0.1, "float"),
        (True, "float"),
        ("ten", "not a number"),
        ("NaN", "not a finite"),
        ("Infinity", "not a finite"),
        ("-0.01", "negative"),
        (["1"], "not a number"),
        ("1e-30", "decimal places"),
        ("1234567890123456789012345678901", "digits"),
    ],
)
def test_what_is_no_amount_is_refused_with_its_reason(written: object, why: str) -> None:
    """A float, a bool, text, NaN, infinity, a negative or an absurdly precise number."""
    with pytest.raises(ValueError, match=why):
        amount(written)


def test_yaml_numbers_are_read_as_the_decimals_written() -> None:
    """``0.1`` is one tenth exactly, not the float nearest it; integers stay integers;
    ``.inf`` is left as text for validation to refuse."""
    data = read_yaml("a: 0.1\nb: 1.5e-07\nc: 3\nd: .inf\ne: '0.2'\nf: 1_000.5\n")
    assert data == {
        "a": Decimal("0.1"),
        "b": Decimal("1.5e-07"),
        "c": 3,
        "d": ".inf",
        "e": "0.2",
        "f": Decimal("1000.5"),
    }
    assert isinstance(data["c"], int)


@given(AMOUNTS)
def test_nanos_never_count_less_than_was_spent(value: Decimal) -> None:
    """Rounded up, by less than one billionth; exact when the amount has nine places."""
    nanos = nanos_up(value)
    assert from_nanos(nanos) >= value > from_nanos(nanos - 1)
    if value == value.quantize(Decimal("1e-9")):
        assert from_nanos(nanos) == value


def test_nanos_are_billionths() -> None:
    """A price of 0.00000015 for 3 tokens is 450 billionths; a budget of 250 is 2.5e11."""
    assert nanos_up(Decimal("0.00000045")) == 450
    assert nanos_up(Decimal(250)) == 250 * NANOS
    assert nanos_up(Decimal("0.0000000001")) == 1


@pytest.mark.parametrize(
    ("value", "decimals", "stated"),
    [
        ("0.125", 2, "0.12"),  # half to even
        ("0.135", 2, "0.14"),
        ("0.1349999", 2, "0.13"),
        ("1234.5", 0, "1234"),
        ("0.0005", 3, "0.000"),
        ("0", 2, "0.00"),
    ],
)
def test_an_invoice_rounds_half_to_even(value: str, decimals: int, stated: str) -> None:
    """The one rounding of an invoice, to the currency's minor unit."""
    assert str(due(Decimal(value), decimals)) == stated


@given(AMOUNTS)
def test_rounding_twice_changes_nothing(value: Decimal) -> None:
    """Rounding a stated amount again is the amount: the rule is applied once."""
    once = due(value, 2)
    assert due(once, 2) == once
    assert abs(once - value) <= Decimal("0.005")


def test_minor_units_of_currencies() -> None:
    """ISO 4217: cents for most, none for yen, thousandths for dinars."""
    assert [decimals_of(c) for c in ("USD", "EUR", "JPY", "KWD")] == [2, 2, 0, 3]


@pytest.mark.parametrize(
    ("value", "written"),
    [("4.5E-7", "0.00000045"), ("2.5E+2", "250"), ("1.50", "1.5"), ("0E-9", "0")],
)
def test_amounts_are_written_out_in_full(value: str, written: str) -> None:
    """No exponent, no trailing zeros."""
    assert plain(Decimal(value)) == written
