"""A tenant's standing as the shared store holds it, read only: which keys to read
(``tenant_parts``) and what the read answers mean (``standings``), figured as
``reserve.lua`` figures what it answers (holds past their expiry given back, a budget's
``used`` the replicas' parts together), so every replica reads the same. The read itself
(the store's clock, then every key in one transaction) is ``RedisLimiter.standing``'s:
only the Redis limiter speaks to the store."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from proxy.limits.limiter import LimitStanding, Who
from proxy.limits.policy import Policies
from proxy.limits.standings import budget_standing, gate_standing, rate_standing, tenant_levels
from proxy.limitstore.tickets import Taken


def tenant_parts(
    policies: Policies, parts: Callable[[Who, float], list[Taken]], tenant: str, now: float
) -> list[Taken]:
    """Every limit of ``tenant``'s levels, with its keys in the store (``parts``: the
    keys of the limits that apply to one requester)."""
    found: dict[str, Taken] = {}
    for level in tenant_levels(policies, tenant):
        scope = level.scope
        model = scope[2] if scope[0] == "model" else None
        key = scope[2] if scope[0] == "key" else None
        for part in parts(Who(tenant, model, key), now):
            if part.scope == scope:
                found.setdefault(part.key, part)
    return list(found.values())


def standings(parts: list[Taken], answers: list[Any], clock: float) -> list[LimitStanding]:
    """What the store's answers say of each of ``parts`` at the store's ``clock``: a rate's
    theoretical arrival time; a budget's or a gate's used and reserved, and its holds
    expired by then."""
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
