"""The outbox's retry waits: capped, doubling, with equal jitter, never below the floor."""

from __future__ import annotations

from unittest import mock

from hypothesis import given
from hypothesis import strategies as st

from proxy.ledger.outbox import _next_backoff

LOW, HIGH = 0.2, 30.0


@given(
    st.floats(min_value=0, max_value=100),
    st.floats(min_value=0, max_value=1, exclude_max=True),
)
def test_every_wait_is_within_the_floor_and_the_cap(current: float, draw: float) -> None:
    """Whatever the last wait and the random draw, the next wait lies between
    ``--min-backoff`` and ``--max-backoff`` and is at least half the doubled wait."""
    with mock.patch("proxy.ledger.outbox.random.random", return_value=draw):
        wait = _next_backoff(current, LOW, HIGH)
    base = min(HIGH, max(LOW, current * 2))
    assert max(LOW, base / 2) <= wait <= base


def test_the_first_wait_is_the_floor() -> None:
    """Regression: the first wait after a success was a random half to all of the floor,
    so a sink was retried sooner than ``--min-backoff``."""
    assert {_next_backoff(0.0, LOW, HIGH) for _ in range(200)} == {LOW}
