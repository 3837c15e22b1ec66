"""How a tenant stands against its limits, read with the limiters' own arithmetic: the
levels a tenant has (its own, its models', its keys'), each meter's reading as the
``x-ratelimit-*`` headers would say it (``meters``, ``rates``), and the reading as the
usage API answers it, a money budget in the price file's currency."""

from __future__ import annotations

from datetime import UTC, datetime

from proxy.accounting.money import from_nanos, plain
from proxy.limits.limiter import LimitStanding, Standing
from proxy.limits.meters import BudgetMeter, Gate, Meter
from proxy.limits.policy import RATE_SECONDS, Level, Limit, Policies
from proxy.limits.rates import Rate


def tenant_levels(policies: Policies, tenant: str) -> list[Level]:
    """Every level of ``tenant``: its own (or the default's), then each of its models'
    and each of its keys' (as ``budgets.budget_use`` lists them)."""
    found: dict[tuple[str, ...], Level] = {}
    own = policies.tenants.get(tenant)
    models = [None, *own.models] if own is not None else [None]
    keys = list(own.keys) if own is not None else []
    for model in models:
        for level in policies.levels(tenant, model, None):
            found.setdefault(level.scope, level)
    for key in keys:
        for level in policies.levels(tenant, None, key):
            found.setdefault(level.scope, level)
    return list(found.values())


def tenant_limits(policies: Policies, tenant: str) -> list[tuple[tuple[str, ...], Limit]]:
    """Every limit of every level of ``tenant``, with its level's scope."""
    return [(lv.scope, limit) for lv in tenant_levels(policies, tenant) for limit in lv.limits]


def meter_standing(scope: tuple[str, ...], limit: Limit, meter: Meter, now: float) -> LimitStanding:
    """A meter of this process as the headers would tell it now (``meter.standing``)."""
    amount, remaining, reset = meter.standing(now)
    told = Standing(amount, remaining, reset)
    if isinstance(meter, BudgetMeter):
        return LimitStanding(scope, limit, meter.used, meter.reserved, told, meter.start, meter.end)
    if isinstance(meter, Gate):
        return LimitStanding(scope, limit, meter.held, 0, told)
    return LimitStanding(scope, limit, amount - remaining, 0, told)


def rate_standing(scope: tuple[str, ...], limit: Limit, tat: float, now: float) -> LimitStanding:
    """A rate whose theoretical arrival time is ``tat`` (a store's), read at ``now``."""
    assert limit.window is not None
    rate = Rate(limit.amount, RATE_SECONDS[limit.window], tat)
    remaining = rate.remaining(now)
    return LimitStanding(
        scope,
        limit,
        limit.amount - remaining,
        0,
        Standing(limit.amount, remaining, rate.reset(now)),
    )


def budget_standing(
    scope: tuple[str, ...],
    limit: Limit,
    used: int,
    held: int,
    period: tuple[float, float],
    now: float,
) -> LimitStanding:
    """A budget billed ``used`` in its period, ``held`` by requests in flight (a store's),
    read at ``now`` (as ``meters.BudgetMeter.standing``)."""
    start, end = period
    told = Standing(limit.amount, max(limit.amount - used - held, 0), end - now)
    return LimitStanding(scope, limit, used, held, told, start, end)


def gate_standing(scope: tuple[str, ...], limit: Limit, held: int) -> LimitStanding:
    """A concurrency limit with ``held`` requests in flight."""
    return LimitStanding(
        scope, limit, held, 0, Standing(limit.amount, max(limit.amount - held, 0), 0.0)
    )


def standing_json(
    reading: LimitStanding, currency: str | None, zone_now: float
) -> dict[str, object]:
    """One limit as the usage API answers it: a money budget's figures in ``currency``
    (written in full, as strings), every other in its unit; ``reset_at`` the instant the
    limit is whole again (``zone_now``: the moment read)."""
    limit, told = reading.limit, reading.standing
    money = limit.money

    def said(units: int) -> int | str:
        return plain(from_nanos(units)) if money else units

    scope = reading.scope
    level = {"level": scope[0], **({scope[0]: scope[2]} if len(scope) > 2 else {})}
    body: dict[str, object] = {
        "name": limit.name,
        **level,
        "kind": "concurrency" if limit.window is None else "budget" if limit.budget else "rate",
        "unit": "currency" if money else limit.unit.value,
        "limit": said(told.limit),
        "used": said(reading.used),
        "held": said(reading.held),
        "remaining": said(told.remaining),
        "reset_seconds": round(told.reset, 3),
        "reset_at": _iso(zone_now + told.reset) if told.reset else None,
    }
    if money:
        body["currency"] = currency
    if reading.start is not None and reading.end is not None:
        body["period"] = {"start": _iso(reading.start), "end": _iso(reading.end)}
    return body


def _iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).isoformat(timespec="milliseconds")
