"""Money budgets (``cost_per_*``) against the price table: which models must have a price
while one applies, and a request's reservation and bill in billionths (``Cost.money``).

The rule: a reservation is the dearest the units it may bill (its reserved tokens, or an
audio request's seconds) can cost at any price in force from when it is made until its
request's timeout (``Rate.most``: the record is priced at its own time, which may be after
a price change), rounded up to a billionth; a unit without a price in that time, or a
time without a price, refuses it. A settlement is the record's units at the price in
force at the record's time, exact, rounded up to a billionth (so exact whenever the prices
have at most nine decimal places). The invoice is not these
billionths: it is the records re-priced exactly and rounded once (``ledger.charges``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal

from proxy.accounting.money import nanos_up
from proxy.accounting.prices import PriceTable
from proxy.accounting.units import Quantities
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
    if missing:
        # No time in the sentence: it is said again only when what is missing changes.
        return (
            f"no price in force now for {', '.join(repr(m) for m in missing)}, while a "
            "cost_per_* budget applies to it (its requests under that budget are refused): "
            "price it in the price file (or give a default)"
        )
    return _gapped(table, sorted(wanted, key=str), at)


def _gapped(table: PriceTable, models: list[str], at: datetime) -> str | None:
    """A price gap ahead (one price's ``until`` before the next one's ``from``) for a model
    a money budget applies to: its requests then would be billed at no price."""
    for model in models:
        gap = table.gap(model, at)
        if gap is not None:
            start, end = (t.isoformat(timespec="seconds") for t in gap)
            return (
                f"no price in force from {start} to {end} for {model!r}, while a "
                "cost_per_* budget applies to it: close the gap between its prices"
            )
    return None


@dataclass(frozen=True, slots=True)
class Unpriced:
    """Why a reservation cannot be priced (said in its refusal)."""

    why: str


def reserved(
    cost: Cost,
    table: PriceTable,
    model: str | None,
    at: datetime,
    *,
    within: timedelta = timedelta(0),
    units: Quantities | None = None,
) -> Cost | Unpriced:
    """``cost`` with its money: the most ``units`` (by default its tokens) can cost at
    any price in force for ``model`` from ``at`` to ``at + within`` (its record, made when
    it ends, is priced at that time); Unpriced when some instant of it has no price, or a
    unit it holds has none."""
    q = units if units is not None else Quantities(cost.prompt, cost.completion)
    end = at + within
    rates = table.over(model, at, end)
    if rates is None:
        stamp = f"{at.isoformat(timespec='seconds')} to {end.isoformat(timespec='seconds')}"
        return Unpriced(f"model {model!r} has no price in force from {stamp}")
    most = Decimal(0)
    for rate in rates:
        amount = rate.most(q)
        if amount is None:
            names = ", ".join(unit.value for unit in rate.unpriced(q))
            return Unpriced(f"model {model!r} has no price for {names} in the price file")
        most = max(most, amount)
    return replace(cost, money=nanos_up(most))


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
