"""The budget meter and the gate (the rate meter is GCRA: test_rates.py)."""

from __future__ import annotations

import math
from datetime import datetime
from zoneinfo import ZoneInfo

from proxy.limits.meters import GATE_RETRY_SECONDS, HELD_RETRY_SECONDS, BudgetMeter, Gate
from proxy.limits.policy import Limit, Unit, Window

UTC = ZoneInfo("UTC")
NOON = datetime(2026, 12, 3, 12, tzinfo=UTC).timestamp()
MIDNIGHT = datetime(2026, 12, 4, tzinfo=UTC).timestamp()


def test_budget_waits_for_its_reset_or_its_reservations() -> None:
    """Room held by reservations in flight may come back soon; room billed comes back at
    the period's end; a new period is read from the history."""
    reads: list[tuple[float, float]] = []

    def used_in(start: float, end: float) -> int:
        reads.append((start, end))
        return 60

    meter = BudgetMeter(Limit(Unit.TOTAL, Window.DAY, 100), UTC, used_in)
    assert meter.wait(40, NOON) == 0
    meter.take(40, NOON)
    assert meter.wait(10, NOON) == HELD_RETRY_SECONDS
    meter.adjust(40, 40, NOON)
    assert meter.wait(10, NOON) == MIDNIGHT - NOON
    assert meter.wait(101, NOON) == math.inf
    assert meter.wait(1, MIDNIGHT + 1) == 0  # a new day: 60 read back, 40 left
    assert len(reads) == 2


def test_gate() -> None:
    """Requests in flight up to the amount; a refusal is told to retry after a second."""
    gate = Gate(Limit(Unit.REQUESTS, None, 1))
    gate.take(1, 0.0)
    assert gate.wait(1, 0.0) == GATE_RETRY_SECONDS
    gate.adjust(1, 1, 0.0)
    assert gate.wait(1, 0.0) == 0
