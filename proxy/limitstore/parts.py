"""This replica's part of the store's budgets and its requests there: what its journal
billed in each period, less the settlements on their way to the store (``own``); its
reservations in flight through the store (``live``) and those it admitted without it
(``holds``); the budgets it has a part in or watches for an outage; and what a
contribution of every part carries (``RedisLimiter.sync``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy.limits.history import History, bucket_of, matches
from proxy.limits.limiter import Cost, Ticket, Who
from proxy.limits.policy import Policies
from proxy.limitstore.keyspace import Keyspace
from proxy.limitstore.tickets import BUDGET_GRACE_SECONDS, LocalTicket, StoreTicket, Taken


@dataclass(frozen=True, slots=True)
class Carried:
    """What one contribution carries: this replica's budgets (each with its part), the
    settlements whose ids it claims, and the holds it takes of requests in flight:
    admitted without the store (``local``, each taken once), and reserved in it
    (``stored``: taken again in a generation new to this replica)."""

    parts: list[Taken]
    claims: list[str]
    local: list[LocalTicket]
    stored: list[StoreTicket]

    def holds(self) -> list[tuple[StoreTicket | LocalTicket, Taken, int]]:
        """Each hold to take: its ticket, its part, and whether to take it whatever the
        generation (1) or only in one new to this replica (0)."""
        held: list[tuple[StoreTicket | LocalTicket, Taken, int]] = [
            (t, p, 1) for t in self.local for p in t.parts
        ]
        return held + [(t, p, 0) for t in self.stored for p in t.parts if p.kind != "r"]


class ReplicaParts:
    """This replica's usage, holds and requests in flight in the shared limiter."""

    def __init__(self, keys: Keyspace, policies: Callable[[], Policies]) -> None:
        self.keys = keys
        self._policies = policies
        self.history = History()  # this replica's billed usage: its part of each budget
        self.holds: dict[str, LocalTicket] = {}  # admitted without the store, not yet ended
        # settlements in the history whose sending to the store is under way (by ticket
        # id): left out of this replica's part until it has answered (``own``)
        self.sending: dict[str, tuple[Who, Cost, float]] = {}
        self.live: dict[str, StoreTicket] = {}  # reserved in the store, not yet ended
        # settlements whose sending failed (in this replica's total from then on) that no
        # contribution has carried yet: the next one to carry them claims their ids
        self.unclaimed: dict[str, StoreTicket] = {}
        # the budgets the limits file names, for these policies, until a period ends
        self._named: tuple[Policies, float, list[Taken]] | None = None

    def parts(self, who: Who, now: float) -> list[Taken]:
        """Every limit that applies to ``who``, with its keys in the store."""
        return self.keys.parts(self._policies(), who, now)

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

    def note(self, ticket: Ticket, billed: Cost, now: float) -> None:
        """Add a settlement to this replica's history, once per reservation; one of a
        store reservation is sending until the store confirms it (``finish``)."""
        if isinstance(ticket, StoreTicket):
            if not ticket.note():
                return
            if ticket.parts:
                self.sending[ticket.id] = (ticket.who, billed, now)
        self.history.note(ticket.who, billed, now)

    def ended(self, ticket: Ticket) -> None:
        """The ticket's request ended: its holds are no longer renewed (its settlement or
        release gives them back, or else they expire by their TTL)."""
        ticket.end()
        self.live.pop(ticket.id, None)

    def unconfirmed(self, ticket: Ticket) -> None:
        """A settlement the store did not confirm: in this replica's part from now on, its
        id claimed by the next contribution (its first sending may still land)."""
        self.sending.pop(ticket.id, None)
        if isinstance(ticket, StoreTicket):
            self.unclaimed[ticket.id] = ticket

    def orphaned(self, ticket: Ticket) -> None:
        """A reservation of a store state that is gone ended: its bill is in this
        replica's part now."""
        self.sending.pop(ticket.id, None)

    def hold(self, ticket: LocalTicket) -> None:
        self.holds[ticket.id] = ticket

    def unhold(self, ticket: LocalTicket) -> None:
        del self.holds[ticket.id]

    def in_flight(self, scope: tuple[str, ...]) -> int:
        """The requests this replica has in flight through the store at ``scope``."""
        return sum(1 for t in self.live.values() if t.open and matches(scope, t.who))

    def claimed(self, claims: list[str]) -> None:
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
        policies = self._policies()
        if self._named is not None:
            named, until, parts = self._named
            if named is policies and now < until:
                return parts
        whos: set[Who] = set()
        for tenant, own in policies.tenants.items():
            whos.add(Who(tenant))
            whos.update(Who(tenant, model) for model in own.models)
            whos.update(Who(tenant, None, key) for key in own.keys)
        found: dict[str, Taken] = {}
        for who in whos:
            found.update((p.key, p) for p in self.parts(who, now) if p.kind == "b")
        parts = list(found.values())
        self._named = (policies, min((p.span for p in parts), default=now + 3600), parts)
        return parts

    def contribution(self, now: float) -> Carried:
        """What a contribution now carries; its local holds are being taken from now on
        (their end gives a hold back, should it have been taken)."""
        local = [t for t in self.holds.values() if t.open]
        for ticket in local:
            ticket.adopt()
        stored = [t for t in self.live.values() if t.open]
        return Carried(self.budgets(now), list(self.unclaimed), local, stored)

    def contributed(self, sent: Carried, generation: str) -> None:
        """The store took ``sent`` in ``generation``."""
        self.claimed(sent.claims)
        for ticket in sent.local:
            ticket.confirm()  # renewed while it runs
        for reserved in sent.stored:  # held in this generation now, whichever it was made in
            reserved.reserved_in(generation)

    def renewal(self) -> tuple[list[str], list[Any]]:
        """The holds of every reservation still alive, to extend: keys and members."""
        keys: list[str] = []
        members: list[Any] = []
        for rid in [rid for rid, t in self.live.items() if not t.open]:
            del self.live[rid]
        alive: list[StoreTicket | LocalTicket] = [*self.live.values()]
        alive += [t for t in self.holds.values() if t.adopted]
        for each in alive:
            for part in each.parts:
                if part.kind != "r":
                    keys += [part.key, part.holds]
                    members.append(f"{each.id}|{each.cost.of(part.limit.unit)}")
        return keys, members

    def budget_args(self, parts: list[Taken]) -> list[Any]:
        """Each budget's part and expiry, as a contribution sends them."""
        args: list[Any] = []
        for part in parts:
            args += [self.own(part), part.span + BUDGET_GRACE_SECONDS]
        return args
