"""This replica's part of each budget in the store: what its journal billed in the
period, less the settlements on their way there (``own``); the budgets it has a part in
or watches for an outage; and its contribution of every part as its total, with the
holds of its requests in flight (``sync``), which starts a generation, the rebuild, on a
store found empty."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from proxy.limits.history import bucket_of, matches
from proxy.limits.limiter import Usage, Who
from proxy.limitstore.keyspace import StoreLayout
from proxy.limitstore.tickets import (
    BUDGET_GRACE_SECONDS,
    DONE_SECONDS,
    GENERATION_SECONDS,
    LocalTicket,
    StoreTicket,
    Synced,
    Taken,
)


class ReplicaParts(StoreLayout):
    """What this replica contributes to the store's budgets (``RedisLimiter``'s base)."""

    def own(self, part: Taken) -> int:
        """This replica's part of a budget: what it billed in the period, less the
        settlements the store has not confirmed (each adds itself there, see
        ``scripts``). Its requests in flight are held in the store apart (``sync``)."""
        if part.kind != "b":
            return 0
        unit = part.limit.unit
        billed = self.history.used(part.scope, unit, part.start, part.span)
        sending = sum(
            cost.of(unit)
            for who, cost, at in self.sending.values()
            if matches(part.scope, who) and part.start <= bucket_of(at) < part.span
        )
        return billed - sending

    def _claimed(self, claims: list[str]) -> None:
        for rid in claims:
            self.unclaimed.pop(rid, None)

    def budgets(self, now: float) -> list[Taken]:
        """Every budget of this period this replica has a part in (billed or held)."""
        whos = set(self.history.whos()) | {t.who for t in self.holds.values()}
        whos |= {t.who for t in self.live.values()}
        found: dict[str, Taken] = {}
        for who in whos:
            for part in self.parts(who, now):
                if part.kind == "b":
                    found.setdefault(part.key, part)
        return list(found.values())

    def watched(self, now: float) -> list[Taken]:
        """The budgets of this period whose remainder this replica keeps for an outage:
        every budget the limits file names (its tenants', their models' and keys'), and
        every one this replica has a part in, or a reservation at (``budgets``)."""
        found = {p.key: p for p in self.budgets(now)}
        for part in self._named_budgets(now):
            found.setdefault(part.key, part)
        return list(found.values())

    def _named_budgets(self, now: float) -> list[Taken]:
        """The budgets the limits file names, worked out again when it is replaced or one
        of their periods ends."""
        if self._named is not None:
            policies, until, parts = self._named
            if policies is self.policies and now < until:
                return parts
        whos: set[Who] = set()
        for tenant, own in self.policies.tenants.items():
            whos.add(Who(tenant))
            whos.update(Who(tenant, model) for model in own.models)
            whos.update(Who(tenant, None, key) for key in own.keys)
        found: dict[str, Taken] = {}
        for who in whos:
            found.update((p.key, p) for p in self.parts(who, now) if p.kind == "b")
        parts = list(found.values())
        self._named = (self.policies, min((p.span for p in parts), default=now + 3600), parts)
        return parts

    async def sync(self, known: int, now: float) -> Synced:
        """Contribute this replica's part of every budget to the store (one round trip),
        starting a generation if the store has none, and take the holds of its requests in
        flight there: those admitted without the store, and, in a generation new to this
        replica, those reserved in the store state that is gone. ``known``: the replicas
        the operator declared (0: none), whom a new generation waits for (else its grace)."""
        parts = self.budgets(now)
        claims = list(self.unclaimed)
        local = [t for t in self.holds.values() if isinstance(t, LocalTicket) and t.open]
        stored = [t for t in self.live.values() if t.open]
        held: list[tuple[StoreTicket | LocalTicket, Taken, int]] = [
            (t, p, 1) for t in local for p in t.parts
        ]
        held += [(t, p, 0) for t in stored for p in t.parts if p.kind != "r"]
        keys = [self.generation_key, self.registry_key]
        keys += [self.done_key(rid) for rid in claims] + [p.key for p in parts]
        args: list[Any] = [self.replica, known, self.grace, GENERATION_SECONDS]
        args += [uuid.uuid4().hex, len(parts), self.generation or ""]
        args += [len(claims), DONE_SECONDS, self.reservation_ttl, len(held)]
        for part in parts:
            args += [self.own(part), part.span + BUDGET_GRACE_SECONDS]
        for ticket, part, always in held:
            keys += [part.key, part.holds, self.done_key(ticket.id)]
            units = ticket.cost.of(part.limit.unit)
            expire = part.span + BUDGET_GRACE_SECONDS if part.kind == "b" else 0
            args += [f"{ticket.id}|{units}", units, expire, always]
        for ticket in local:
            ticket.adopting = True  # its end gives a hold back, should this have taken it
        out = await self._sync(keys=keys, args=args)
        self._claimed(claims)
        generation = out[0].decode() if isinstance(out[0], bytes) else str(out[0])
        for ticket in local:
            ticket.adopted = ticket.open  # renewed while it runs
        for reserved in stored:  # held in this generation now, whichever it was made in
            reserved.generation = generation
        self.generation = generation
        return Synced(generation, bool(int(out[1])), bool(int(out[2])), len(parts))

    async def restore(self, history: Iterable[Usage], now: float) -> int:
        taken = 0
        for usage in history:
            self.history.note(usage.who, usage.cost, usage.at)
            taken += 1
        return taken
