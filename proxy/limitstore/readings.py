"""A tenant's standing read from the shared store, read only: the store's clock
(``TIME``), then every key of its limits in one transaction (a snapshot), figured as
``reserve.lua`` figures what it answers (holds past their expiry given back, a budget's
``used`` the replicas' parts together), so every replica reads the same."""

from __future__ import annotations

from typing import Any

from proxy.limits.limiter import LimitStanding, StandingUnknown, Who
from proxy.limits.standings import budget_standing, gate_standing, rate_standing, tenant_levels
from proxy.limitstore.keyspace import StoreLayout
from proxy.limitstore.tickets import Taken


def tenant_parts(layout: StoreLayout, tenant: str, now: float) -> list[Taken]:
    """Every limit of ``tenant``'s levels, with its keys in the store (``parts``)."""
    found: dict[str, Taken] = {}
    for level in tenant_levels(layout.policies, tenant):
        scope = level.scope
        model = scope[2] if scope[0] == "model" else None
        key = scope[2] if scope[0] == "key" else None
        for part in layout.parts(Who(tenant, model, key), now):
            if part.scope == scope:
                found.setdefault(part.key, part)
    return list(found.values())


async def store_standing(layout: StoreLayout, tenant: str, now: float) -> list[LimitStanding]:
    """What the store holds of ``tenant``'s limits now (``StandingUnknown`` while its
    budgets are being rebuilt: they are not whole)."""
    parts = tenant_parts(layout, tenant, now)
    seconds, micros = await layout.client.time()
    clock = float(seconds) + float(micros) / 1_000_000  # the store's, as its scripts read it
    async with layout.client.pipeline(transaction=True) as pipe:
        pipe.hget(layout.generation_key, "complete")
        for part in parts:
            if part.kind == "r":
                pipe.get(part.key)
            else:  # the holds expired by ``clock`` only: those in flight may be many
                pipe.hmget(part.key, "used", "reserved")
                pipe.zrangebyscore(part.holds, "-inf", clock)
        answers: list[Any] = await pipe.execute()
    if answers[0] not in (b"1", "1"):
        raise StandingUnknown("the limits store's budgets are being rebuilt")
    return _read(parts, answers[1:], clock)


def _read(parts: list[Taken], answers: list[Any], clock: float) -> list[LimitStanding]:
    out, at = [], 0
    for part in parts:
        if part.kind == "r":
            tat = float(answers[at] or 0)
            out.append(rate_standing(part.scope, part.limit, tat, clock))
            at += 1
            continue
        used, reserved = (int(v or 0) for v in answers[at])
        expired = sum(_units(member) for member in answers[at + 1])
        held = max(reserved - expired, 0)
        at += 2
        if part.kind == "g":
            out.append(gate_standing(part.scope, part.limit, held))
        else:
            span = (part.start, part.span)  # a budget part's span is its period's end
            out.append(budget_standing(part.scope, part.limit, used, held, span, clock))
    return out


def _units(member: bytes | str) -> int:
    """A hold's units: its member is ``<id>|<units>``."""
    text = member.decode() if isinstance(member, bytes) else member
    return int(text.rpartition("|")[2])
