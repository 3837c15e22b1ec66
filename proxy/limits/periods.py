"""Budget periods: a day, an ISO week (from Monday) or a calendar month in the policy's
time zone, each starting and ending on an exact local boundary (a DST day is 23 or 25
hours long, as the clock on the wall says)."""

from __future__ import annotations

from datetime import date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from proxy.limits.policy import Window


def period(window: Window, now: float, zone: ZoneInfo) -> tuple[float, float]:
    """The period of ``window`` holding ``now`` (Unix seconds): its start and end."""
    local = datetime.fromtimestamp(now, zone)
    today = local.date()
    if window is Window.DAY:
        start, end = _local(today, zone), _local(today + timedelta(days=1), zone)
    elif window is Window.WEEK:
        monday = today - timedelta(days=today.weekday())
        start, end = _local(monday, zone), _local(monday + timedelta(days=7), zone)
    elif window is Window.MONTH:
        first = today.replace(day=1)
        following = (first + timedelta(days=32)).replace(day=1)
        start, end = _local(first, zone), _local(following, zone)
    else:
        raise ValueError(f"{window} is a rate, not a budget period")
    return start.timestamp(), end.timestamp()


def _local(day: date, zone: ZoneInfo) -> datetime:
    """Local midnight of ``day``, as an aware datetime."""
    return datetime.combine(day, time(), tzinfo=zone)


def earliest_start(now: float, zone: ZoneInfo) -> float:
    """The start of the oldest period any budget can be in at ``now``: what the journal
    must be read from to rebuild every budget."""
    return min(period(w, now, zone)[0] for w in (Window.DAY, Window.WEEK, Window.MONTH))
