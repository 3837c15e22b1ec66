"""The report's budget section: each budget's use in its period, by the admission's
arithmetic (calendar periods in the policy's zone, levels as admission finds them)."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

from proxy.limits.budgets import budget_use
from proxy.limits.limiter import Cost, Usage, Who
from proxy.limits.policy import Policies
from proxy.limitstore.memory import InProcessLimiter

BERLIN = ZoneInfo("Europe/Berlin")


def at(day: int, hour: int) -> float:
    return datetime(2026, 12, day, hour, tzinfo=BERLIN).timestamp()


POLICIES = Policies.model_validate(
    {
        "timezone": "Europe/Berlin",
        "default": {"prompt_tokens_per_day": 50},
        "tenants": {
            "acme": {
                "prompt_tokens_per_month": 1000,
                "requests_per_minute": 10,
                "models": {"big": {"total_tokens_per_week": 300}},
                "keys": {"k1": {"requests_per_day": 5}},
            }
        },
    }
)


def test_each_budget_sums_its_own_period_and_level() -> None:
    """The month counts every acme record since 1 December (Berlin), the week only this
    ISO week's records of model big (prompt and completion), the key's day only today's
    requests by k1; a default-limited tenant appears once it has records; rates are no
    budgets; a record after the moment asked about is not counted."""
    history = [
        Usage(Who("acme", "big", "k1"), at(1, 9), Cost(100, 20)),  # Tuesday, last week
        Usage(Who("acme", "big", "k2"), at(8, 9), Cost(40, 10)),  # Tuesday, this week
        Usage(Who("acme", "small", "k1"), at(9, 8), Cost(7, 0)),  # today
        Usage(Who("acme", "small", "k1"), at(9, 12), Cost(999, 0)),  # after ``at``
        Usage(Who("zeta", None, None), at(9, 1), Cost(30, 0)),
    ]
    uses = {(u.scope, u.budget): u for u in budget_use(POLICIES, history, at(9, 10))}
    assert list(uses) == [
        (("tenant", "acme"), "prompt_tokens_per_month"),
        (("model", "acme", "big"), "total_tokens_per_week"),
        (("key", "acme", "k1"), "requests_per_day"),
        (("tenant", "zeta"), "prompt_tokens_per_day"),
    ]
    month = uses[("tenant", "acme"), "prompt_tokens_per_month"]
    assert (month.used, month.amount, month.remaining) == (147, 1000, 853)
    assert month.start == datetime(2026, 12, 1, tzinfo=BERLIN).timestamp()
    assert uses[("model", "acme", "big"), "total_tokens_per_week"].used == 50
    assert uses[("key", "acme", "k1"), "requests_per_day"].used == 1
    assert uses[("tenant", "zeta"), "prompt_tokens_per_day"].remaining == 20


async def test_the_report_agrees_with_what_admission_would_say() -> None:
    """What the section shows left of a tenant's budget is what the limiter rebuilt from
    the same history answers in its headers."""
    history = [Usage(Who("acme", "small", "k9"), at(d, 9), Cost(90, 5)) for d in (1, 3, 9)]
    limiter = InProcessLimiter(POLICIES)
    await limiter.restore(history, at(9, 10))
    decision = await limiter.reserve(Who("acme", "small", "k9"), Cost(1), at(9, 10))
    assert decision.budgets == (("prompt_tokens_per_month", 1000 - 270 - 1),)
    month = budget_use(POLICIES, history, at(9, 10))[0]
    assert (month.budget, month.remaining) == ("prompt_tokens_per_month", 1000 - 270)
