"""GCRA: a burst of the whole amount, then one unit per interval; exact waits; what is
given back is available again; never more than the amount."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from proxy.limits.rates import Rate


def test_burst_then_steady() -> None:
    """60 per minute: 60 at once, then one more each second, with the exact wait."""
    rate = Rate(60, 60.0)
    for _ in range(60):
        assert rate.wait(1, 100.0) == 0
        rate.take(1, 100.0)
    assert rate.remaining(100.0) == 0
    assert math.isclose(rate.wait(1, 100.0), 1.0)
    assert math.isclose(rate.wait(3, 100.25), 2.75)
    assert rate.wait(1, 101.0) == 0
    assert math.isclose(rate.reset(100.0), 60.0)


def test_a_cost_above_the_amount_never_fits() -> None:
    """The wait is infinite: the caller answers 400, not 429."""
    assert Rate(10, 1.0).wait(11, 0.0) == math.inf


def test_given_back_is_available_again() -> None:
    """A release (or a settlement below the reservation) returns the units."""
    rate = Rate(100, 60.0)
    rate.take(80, 5.0)
    assert rate.remaining(5.0) == 20
    rate.give(50)
    assert rate.remaining(5.0) == 70


@given(
    st.lists(st.tuples(st.integers(1, 20), st.floats(0, 5)), max_size=40),
    st.integers(1, 50),
)
def test_never_more_than_the_amount_in_any_window(
    steps: list[tuple[int, float]], amount: int
) -> None:
    """Whatever the arrivals, what is admitted within any window of the limit's length
    never exceeds the amount plus what refills meanwhile (the GCRA bound)."""
    rate, now, admitted = Rate(amount, 10.0), 0.0, []
    for cost, gap in steps:
        now += gap
        if rate.wait(cost, now) == 0:
            rate.take(cost, now)
            admitted.append((now, cost))
        assert 0 <= rate.remaining(now) <= amount
    for start, _ in admitted:
        inside = sum(c for t, c in admitted if start <= t < start + 10.0)
        assert inside <= 2 * amount
