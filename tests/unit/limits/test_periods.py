"""Budget periods start and end on exact local boundaries, DST days included."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from proxy.limits.periods import earliest_start, period
from proxy.limits.policy import Window

PARIS = ZoneInfo("Europe/Paris")


def at(text: str, zone: ZoneInfo = PARIS) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=zone).timestamp()


@pytest.mark.parametrize(
    ("window", "now", "start", "end"),
    [
        (Window.DAY, "2026-12-03 09:30", "2026-12-03 00:00", "2026-12-04 00:00"),
        (Window.WEEK, "2026-12-03 09:30", "2026-11-30 00:00", "2026-12-07 00:00"),
        (Window.MONTH, "2026-12-03 09:30", "2026-12-01 00:00", "2027-01-01 00:00"),
        (Window.MONTH, "2026-02-28 23:59", "2026-02-01 00:00", "2026-03-01 00:00"),
        (Window.DAY, "2026-03-29 12:00", "2026-03-29 00:00", "2026-03-30 00:00"),  # 23 h
    ],
)
def test_local_boundaries(window: Window, now: str, start: str, end: str) -> None:
    """Local midnight, Monday, the first of the month, in the policy's zone."""
    assert period(window, at(now), PARIS) == (at(start), at(end))


def test_a_dst_day_is_as_long_as_the_wall_clock_says() -> None:
    """Paris springs forward on 2026-03-29: that day lasts 23 hours."""
    start, end = period(Window.DAY, at("2026-03-29 12:00"), PARIS)
    assert end - start == 23 * 3600


def test_rates_have_no_period() -> None:
    """A rate window is refused (it has no calendar boundary)."""
    with pytest.raises(ValueError, match="rate"):
        period(Window.MINUTE, 0.0, PARIS)


def test_earliest_start_covers_week_and_month() -> None:
    """On 2026-12-03 the week began on 30 November, before the month."""
    assert earliest_start(at("2026-12-03 09:30"), PARIS) == at("2026-11-30 00:00")
