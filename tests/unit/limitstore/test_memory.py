"""The in-process limiter: all-or-nothing reservations over every level, settlement to
the billed units, release, budgets rebuilt from history, reloads that keep usage."""

from __future__ import annotations

from collections.abc import Coroutine
from datetime import datetime
from typing import Any, TypeVar, cast
from zoneinfo import ZoneInfo

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.limits.history import History
from proxy.limits.limiter import Cost, Usage, Who
from proxy.limits.meters import BudgetMeter, Gate
from proxy.limits.policy import Policies, Unit
from proxy.limitstore.memory import InProcessLimiter

T = TypeVar("T")
NOW = datetime(2026, 12, 3, 9, 30, tzinfo=ZoneInfo("UTC")).timestamp()
ACME = Who("acme", "m", "k1")


def limiter(**tenant: object) -> InProcessLimiter:
    return InProcessLimiter(Policies.model_validate({"tenants": {"acme": tenant}}))


def run(coro: Coroutine[Any, Any, T]) -> T:
    """The result of a limiter coroutine, which must not suspend: in-process, each
    reservation is atomic on the event loop."""
    try:
        coro.send(None)
    except StopIteration as done:
        return cast(T, done.value)
    raise AssertionError("the in-process limiter suspended")


def test_all_or_nothing_across_levels() -> None:
    """A request refused at the model level takes nothing at the tenant level."""
    lim = limiter(total_tokens_per_day=1000, models={"m": {"prompt_tokens_per_day": 10}})
    decision = run(lim.reserve(ACME, Cost(20, 0), NOW))
    assert decision.ticket is None
    assert decision.refusal is not None
    assert decision.refusal.scope == ("model", "acme", "m")
    assert decision.refusal.alone
    budgets = [m for m in lim.meters.values() if isinstance(m, BudgetMeter)]
    assert all(m.reserved == 0 for m in budgets)


def test_settle_and_release() -> None:
    """Settling replaces the reservation by the billed units; releasing returns it; a
    ticket ends once (a second settle or release changes nothing)."""
    lim = limiter(total_tokens_per_day=100, concurrency=1)
    first = run(lim.reserve(ACME, Cost(30, 20), NOW))
    assert first.ticket is not None
    assert first.tokens is not None
    assert first.tokens.remaining == 50
    assert run(lim.reserve(ACME, Cost(1, 0), NOW)).refusal.limit == "concurrency"
    run(lim.settle(first.ticket, Cost(10, 5), NOW))
    run(lim.settle(first.ticket, Cost(10, 5), NOW))
    run(lim.release(first.ticket, NOW))
    second = run(lim.reserve(ACME, Cost(40, 0), NOW))
    assert second.tokens.remaining == 45
    run(lim.release(second.ticket, NOW))
    (budget,) = [m for m in lim.meters.values() if isinstance(m, BudgetMeter)]
    (gate,) = [m for m in lim.meters.values() if isinstance(m, Gate)]
    assert (budget.used, budget.reserved, gate.held) == (15, 0, 0)


def test_restore_rebuilds_only_the_current_period() -> None:
    """Records of this month count toward a monthly budget; last month's do not; the
    scope decides whose (a model budget sees only its model)."""
    lim = limiter(prompt_tokens_per_month=100, models={"m": {"prompt_tokens_per_month": 50}})
    last_month = datetime(2026, 11, 30, 23, 0, tzinfo=ZoneInfo("UTC")).timestamp()
    history = [
        Usage(Who("acme", "m", None), NOW - 3600, Cost(30, 0)),
        Usage(Who("acme", "other", None), NOW - 7200, Cost(40, 0)),
        Usage(Who("acme", "m", None), last_month, Cost(1000, 0)),
        Usage(Who("bob", "m", None), NOW - 60, Cost(5, 0)),
    ]
    assert run(lim.restore(history, NOW)) == 4
    decision = run(lim.reserve(ACME, Cost(10, 0), NOW))
    assert decision.tokens.remaining == 10  # model: 50-30-10
    assert dict(decision.budgets) == {"prompt_tokens_per_month": 20}  # tenant: 100-70-10


def test_reload_keeps_a_budget_and_restarts_a_rate() -> None:
    """A new amount keeps the budget's period usage; a rate starts afresh."""
    lim = limiter(total_tokens_per_day=100, requests_per_minute=1)
    ticket = run(lim.reserve(ACME, Cost(60, 0), NOW)).ticket
    run(lim.settle(ticket, Cost(60, 0), NOW))
    assert run(lim.reserve(ACME, Cost(1, 0), NOW)).refusal is not None
    lim.replace(
        Policies.model_validate(
            {"tenants": {"acme": {"total_tokens_per_day": 200, "requests_per_minute": 2}}}
        )
    )
    decision = run(lim.reserve(ACME, Cost(100, 0), NOW))
    assert decision.refusal is None
    assert decision.tokens.remaining == 40


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40), st.booleans()), max_size=30))
def test_remaining_billed_and_reserved_add_up(steps: list[tuple[int, int, bool]]) -> None:
    """Whatever is reserved, settled or released, a budget's remaining + used + reserved
    is its amount while within it, and used never exceeds it when billing stays within
    the reservations."""
    lim = limiter(prompt_tokens_per_day=100)
    open_tickets = []
    for cost, billed, settle in steps:
        decision = run(lim.reserve(ACME, Cost(cost, 0), NOW))
        if decision.ticket is not None:
            open_tickets.append((decision.ticket, min(billed, cost)))
        if settle and open_tickets:
            ticket, amount = open_tickets.pop(0)
            run(lim.settle(ticket, Cost(amount, 0), NOW))
        for meter in lim.meters.values():
            assert isinstance(meter, BudgetMeter)
            _, remaining, _ = meter.standing(NOW)
            assert remaining + meter.used + meter.reserved == 100
    for ticket, _ in open_tickets:
        run(lim.release(ticket, NOW))
    for meter in lim.meters.values():
        assert isinstance(meter, BudgetMeter)
        assert meter.reserved == 0
        assert meter.used <= 100


def test_history_older_than_any_period_is_forgotten() -> None:
    """Rows before the oldest period any budget can be in (this week's Monday or this
    month's first) are dropped; the current ones stay, by tenant."""
    lim = limiter(total_tokens_per_month=10**6)
    old = datetime(2026, 10, 30, tzinfo=ZoneInfo("UTC")).timestamp()
    run(lim.restore([Usage(ACME, old, Cost(5, 0)), Usage(ACME, NOW - 60, Cost(7, 0))], NOW))
    ticket = run(lim.reserve(ACME, Cost(1, 0), NOW)).ticket
    assert ticket is not None
    run(lim.settle(ticket, Cost(1, 0), NOW))
    assert lim.history.used(("tenant", "acme"), Unit.PROMPT, 0, NOW + 1) == 8
    assert lim.history.used(("tenant", "bob"), Unit.PROMPT, 0, NOW + 1) == 0


def test_a_money_budget_counts_billionths_like_tokens() -> None:
    """``cost_per_day`` takes a request's money (its reservation, then its bill) as a
    token budget takes tokens; its standing is told apart from the token one."""
    lim = limiter(cost_per_day="0.000001", prompt_tokens_per_day=1000)  # 1,000 billionths
    first = run(lim.reserve(ACME, Cost(10, 0, money=600), NOW))
    assert first.ticket is not None
    assert first.cost is not None
    assert (first.cost.limit, first.cost.remaining) == (1000, 400)
    assert first.tokens is not None
    assert first.tokens.remaining == 990
    refused = run(lim.reserve(ACME, Cost(1, 0, money=500), NOW))
    assert refused.refusal is not None
    assert refused.refusal.limit == "cost_per_day"
    assert refused.refusal.wait == 1.0  # held by a reservation in flight
    run(lim.settle(first.ticket, Cost(10, 0, money=450), NOW))
    assert run(lim.reserve(ACME, Cost(1, 0, money=550), NOW)).ticket is not None
    assert lim.history.used(("tenant", "acme"), Unit.COST, NOW - 60, NOW + 60) == 450
    assert ("cost_per_day", 0) in run(lim.reserve(ACME, Cost(0, 0), NOW)).budgets


def test_a_part_read_again_replaces_what_it_held() -> None:
    """A pod's host keeps each worker's usage as a part: restoring part k again (its
    journal shard re-read after the worker died) replaces that part, never adds to it;
    settlements through worker k count in part k, the other parts stay."""
    lim = limiter(prompt_tokens_per_day=100)
    run(lim.restore([Usage(ACME, NOW, Cost(30, 0))], NOW, part=1))
    run(lim.restore([Usage(ACME, NOW, Cost(10, 0))], NOW, part=0))
    ticket = run(lim.reserve(ACME, Cost(5, 0), NOW)).ticket
    assert ticket is not None
    run(lim.settle(ticket, Cost(5, 0), NOW, part=1))
    assert run(lim.reserve(ACME, Cost(1, 0), NOW)).tokens.remaining == 100 - 45 - 1
    run(lim.restore([Usage(ACME, NOW, Cost(35, 0))], NOW, part=1))  # the shard, with the 5
    decision = run(lim.reserve(ACME, Cost(1, 0), NOW))
    assert decision.tokens is not None
    assert decision.tokens.remaining == 100 - 45 - 2
    assert lim.history.whos() == []


def test_the_first_settlement_after_a_part_is_read_again_counts_once() -> None:
    """A ticket reserved before worker 0's part was read again (the pod's host after a
    worker died) and settled after it, before any other reservation: its billed units
    count once. (The budget re-reads its period at the settlement: noting the units in
    the history first counted them twice, the pod then refused one request too early.)"""
    lim = limiter(prompt_tokens_per_day=100)
    ticket = run(lim.reserve(ACME, Cost(11, 0), NOW)).ticket
    assert ticket is not None
    history = History()
    history.note(ACME, Cost(22, 0), NOW)
    lim.adopt(0, history)
    run(lim.settle(ticket, Cost(11, 0), NOW, part=1))
    decision = run(lim.reserve(ACME, Cost(1, 0), NOW))
    assert decision.tokens is not None
    assert decision.tokens.remaining == 100 - 22 - 11 - 1


def test_a_settlement_that_starts_a_period_counts_once() -> None:
    """The same at a period's turn: a ticket reserved on one day, settled on the next,
    is billed in the new day once."""
    lim = limiter(prompt_tokens_per_day=100)
    ticket = run(lim.reserve(ACME, Cost(11, 0), NOW)).ticket
    assert ticket is not None
    tomorrow = NOW + 86_400
    run(lim.settle(ticket, Cost(11, 0), tomorrow))
    decision = run(lim.reserve(ACME, Cost(1, 0), tomorrow))
    assert decision.tokens is not None
    assert decision.tokens.remaining == 100 - 11 - 1
