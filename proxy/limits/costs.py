"""Money budgets (``cost_per_*``) against the price table: which models must have a price
while one applies, and a request's reservation and bill in billionths (``Cost.money``).

The rule: a reservation is the dearest its reserved tokens can cost at the price in force
when it is made (``Rate.bound``), rounded up to a billionth; a settlement is the record's
units at the price in force at the record's time, exact, rounded up to a billionth (so
exact whenever the prices have at most nine decimal places). The invoice is not these
billionths: it is the records re-priced exactly and rounded once (``ledger.charges``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime
from decimal import Decimal

from proxy.accounting.money import nanos_up
from proxy.accounting.prices import PriceTable, Quantities
from proxy.limits.limiter import Cost
from proxy.limits.policy import Policies


def unpriced(
    policies: Policies, table: PriceTable | None, served: Iterable[str], at: datetime
) -> str | None:
    """Why the policies cannot be used with ``table`` at ``at``, in one line: a money
    budget without a price file, or a model it applies to (one the limits file names,
    or ``served``) with no price in force. None when every such model has one."""
    every, named = policies.budgeted_models()
    if not every and not named:
        return None
    if table is None:
        return "cost_per_* budgets need a price file (--prices)"
    wanted = set(named)
    if every:
        wanted.update(served)
        for own in policies.tenants.values():
            wanted.update(own.models)
    missing = sorted(m for m in wanted if table.rate(m, at) is None)
    if not missing:
        return None
    # No time in the sentence: it is said again only when what is missing changes.
    return (
        f"no price in force now for {', '.join(repr(m) for m in missing)}, while a "
        "cost_per_* budget applies to it (its requests under that budget are refused): "
        "price it in the price file (or give a default)"
    )


def reserved(cost: Cost, table: PriceTable, model: str | None, at: datetime) -> Cost | None:
    """``cost`` with its money: the most its tokens can cost at the price in force at
    ``at``; None when the model has no price then."""
    rate = table.rate(model, at)
    if rate is None:
        return None
    return replace(cost, money=nanos_up(rate.bound(cost.prompt, cost.completion)))


def billed(
    table: PriceTable, model: str | None, q: Quantities, at: datetime, reserved: int
) -> tuple[int, bool]:
    """What a record costs its money budgets, in billionths, and whether every unit it
    holds had a price. One that did not (or a time no price covers) is charged what it
    reserved, or its priced units when they cost more: never less than was known."""
    if q == Quantities():
        return 0, True  # billed nothing (an invalid answer)
    rate = table.rate(model, at)
    if rate is None:
        return reserved, False
    lines = rate.lines(q, strict=False) or ()
    money = nanos_up(sum((line.amount for line in lines), Decimal(0)))
    if rate.lines(q) is None:
        return max(money, reserved), False
    return money, True
