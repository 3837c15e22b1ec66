"""A tenant's standing with the meters' own arithmetic (``standings``): its levels, each
meter read as the headers tell it, the store's figures read the same way, and the answer
with a money budget in its currency."""

from __future__ import annotations

import math

import pytest

from proxy.limits.limiter import Standing
from proxy.limits.meters import BudgetMeter, Gate, RateMeter
from proxy.limits.policy import Limit, Policies, Unit, Window
from proxy.limits.rates import Rate
from proxy.limits.standings import (
    budget_standing,
    gate_standing,
    meter_standing,
    rate_standing,
    standing_json,
    tenant_levels,
)

NOW = 1_780_000_000.0
POLICIES = Policies.model_validate(
    {
        "default": {"requests_per_minute": 5},
        "tenants": {
            "acme": {
                "prompt_tokens_per_day": 100,
                "models": {"big": {"cost_per_month": "2.5"}},
                "keys": {"a" * 64: {"concurrency": 2}},
            }
        },
    }
)


def test_a_tenants_levels_are_its_own_its_models_and_its_keys() -> None:
    """acme's levels are its own, its model's and its key's; another tenant has the
    default's."""
    assert [lv.scope for lv in tenant_levels(POLICIES, "acme")] == [
        ("tenant", "acme"),
        ("model", "acme", "big"),
        ("key", "acme", "a" * 12),
    ]
    assert [lv.scope for lv in tenant_levels(POLICIES, "other")] == [("tenant", "other")]


def test_a_budget_meter_reads_as_its_headers() -> None:
    """A budget's reading is its meter's standing, with what it billed and holds."""
    limit = Limit(Unit.PROMPT, Window.DAY, 100)
    meter = BudgetMeter(limit, POLICIES.zone, lambda start, end: 30)
    meter.take(20, NOW)
    reading = meter_standing(("tenant", "acme"), limit, meter, NOW)
    assert (reading.used, reading.held) == (30, 20)
    assert reading.standing == Standing(*meter.standing(NOW))
    assert reading.standing.remaining == 50
    same = budget_standing(("tenant", "acme"), limit, 30, 20, (meter.start, meter.end), NOW)
    assert same == reading


@pytest.mark.parametrize("taken", [0, 1, 3, 5])
def test_a_rate_reads_the_same_from_a_meter_and_from_a_stores_tat(taken: int) -> None:
    """A rate read from this process's meter and from the same theoretical arrival time
    (a store's) agree; used is what the window has yet to refill."""
    limit = Limit(Unit.REQUESTS, Window.MINUTE, 5)
    meter = RateMeter(limit)
    for _ in range(taken):
        meter.take(1, NOW)
    reading = meter_standing(("tenant", "acme"), limit, meter, NOW)
    assert reading == rate_standing(("tenant", "acme"), limit, meter.rate.tat, NOW)
    assert reading.used == taken
    assert reading.standing.remaining == Rate(5, 60).remaining(NOW) - taken


def test_a_gate_reads_its_requests_in_flight() -> None:
    """A concurrency limit's used is its requests in flight."""
    limit = Limit(Unit.REQUESTS, None, 2)
    gate = Gate(limit)
    gate.take(1, NOW)
    assert meter_standing(("tenant", "acme"), limit, gate, NOW) == gate_standing(
        ("tenant", "acme"), limit, 1
    )


def test_a_money_budget_is_answered_in_its_currency() -> None:
    """Billionths become the currency's amount written in full; tokens stay counts."""
    money = Limit(Unit.COST, Window.MONTH, 2_500_000_000)
    reading = budget_standing(
        ("model", "acme", "big"), money, 1_250_000_001, 0, (NOW, NOW + 60), NOW
    )
    body = standing_json(reading, "EUR", NOW)
    assert body["limit"] == "2.5"
    assert body["used"] == "1.250000001"
    assert body["remaining"] == "1.249999999"
    assert body["currency"] == "EUR"
    assert body["level"] == "model"
    assert body["model"] == "big"
    assert body["kind"] == "budget"
    assert body["reset_seconds"] == 60
    tokens = budget_standing(
        ("tenant", "acme"), Limit(Unit.PROMPT, Window.DAY, 9), 4, 0, (NOW, NOW + 1), NOW
    )
    body = standing_json(tokens, "EUR", NOW)
    assert (body["used"], body["remaining"], body["unit"]) == (4, 5, "prompt_tokens")
    assert "currency" not in body
    assert math.isclose(float(body["reset_seconds"]), 1.0)  # type: ignore[arg-type]
