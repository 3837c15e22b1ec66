"""What each budget has billed in its current period: the report's budget section.

The same arithmetic as admission's (``History``, ``period``): the usage history of the
periods in question, summed per level (tenant, tenant x model, key) over the calendar
period of each budget that holds ``at``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from proxy.limits.history import History
from proxy.limits.limiter import Usage
from proxy.limits.periods import period
from proxy.limits.policy import Level, Policies


@dataclass(frozen=True, slots=True)
class BudgetUse:
    """One budget of one level in the period holding the moment asked about."""

    scope: tuple[str, ...]  # ("tenant", t) | ("model", t, m) | ("key", t, key_hash)
    budget: str  # the limit's name, e.g. prompt_tokens_per_month
    start: float  # the period, Unix seconds
    end: float
    used: int  # billed since the period started (up to ``at``)
    amount: int

    @property
    def remaining(self) -> int:
        return max(self.amount - self.used, 0)


def budget_use(policies: Policies, history: Iterable[Usage], at: float) -> list[BudgetUse]:
    """Every budget of every level the policies name, and of every default-limited tenant
    the history holds, with what it billed in its period holding ``at``; by tenant, then
    the tenant's own budgets, its models' and its keys'."""
    book, levels = History(), dict[tuple[str, ...], Level]()
    for usage in history:
        if usage.at < at:
            book.note(usage.who, usage.cost, usage.at)
        for level in policies.levels(usage.who.tenant, usage.who.model, usage.who.key):
            levels[level.scope] = level
    for tenant, own in policies.tenants.items():
        for model in [None, *own.models]:
            for level in policies.levels(tenant, model, None):
                levels[level.scope] = level
        for key in own.keys:
            for level in policies.levels(tenant, None, key):
                levels[level.scope] = level
    out = []
    for scope, level in sorted(levels.items(), key=_reading_order):
        for limit in level.limits:
            if not limit.budget or limit.window is None:
                continue
            start, end = period(limit.window, at, policies.zone)
            used = book.used(scope, limit.unit, start, end)
            out.append(BudgetUse(scope, limit.name, start, end, used, limit.amount))
    return out


KINDS = ("tenant", "model", "key")


def _reading_order(item: tuple[tuple[str, ...], Level]) -> tuple[str, int, tuple[str, ...]]:
    scope = item[0]
    return scope[1], KINDS.index(scope[0]), scope[2:]
