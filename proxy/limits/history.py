"""The usage history budgets are read from: billed units per (tenant, model, key) in
quarter hours (the boundaries of every period in every time zone in use fall on one), and
which level's requests count where. The in-process limiter, the shared store's replica
part and the report's budgets all sum it."""

from __future__ import annotations

from collections import defaultdict

from proxy.limits.limiter import Cost, Who
from proxy.limits.policy import Unit

BUCKET_SECONDS = 900


def matches(scope: tuple[str, ...], who: Who) -> bool:
    """Whether ``who``'s requests count at the level ``scope``."""
    kind, tenant = scope[0], scope[1]
    if who.tenant != tenant:
        return False
    if kind == "model":
        return who.model == scope[2]
    if kind == "key":
        return who.key == scope[2]
    return True


def bucket_of(at: float) -> int:
    """The quarter hour ``at`` falls in: the bucket a history keeps it in."""
    return int(at // BUCKET_SECONDS) * BUCKET_SECONDS


class History:
    """Billed units per (tenant, model, key) and quarter hour, since the oldest period
    any budget can be in; kept by tenant, so a budget reads only its own tenant's rows."""

    def __init__(self) -> None:
        self._rows: dict[str, dict[Who, dict[int, list[int]]]] = defaultdict(dict)

    def note(self, who: Who, cost: Cost, at: float) -> None:
        row = self._rows[who.tenant].setdefault(who, {}).setdefault(bucket_of(at), [0, 0, 0, 0])
        row[0] += cost.prompt
        row[1] += cost.completion
        row[2] += cost.requests
        row[3] += cost.money

    def used(self, scope: tuple[str, ...], unit: Unit, start: float, end: float) -> int:
        total = 0
        for who, buckets in self._rows.get(scope[1], {}).items():
            if not matches(scope, who):
                continue
            for bucket, (prompt, completion, requests, money) in buckets.items():
                if start <= bucket < end:
                    total += Cost(prompt, completion, requests, money).of(unit)
        return total

    def whos(self) -> list[Who]:
        """Everyone with billed units in the history."""
        return [who for whos in self._rows.values() for who in whos]

    def prune(self, before: float) -> None:
        for tenant, whos in list(self._rows.items()):
            for who, buckets in list(whos.items()):
                for bucket in [b for b in buckets if b < before]:
                    del buckets[bucket]
                if not buckets:
                    del whos[who]
            if not whos:
                del self._rows[tenant]
