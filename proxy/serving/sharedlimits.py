"""Limits shared by every replica on one Redis or Valkey store (``--limits-store``).

Each admission is one round trip: one Lua script (``storescripts``) checks every level
that applies (tenant, tenant x model, key) on the store's clock (``TIME``) and reserves
at all of them or none, answering what the ``x-ratelimit-*`` headers need. Settlement and
release are one round trip each and idempotent: a ticket carries a reservation id, and
the first settle or release of an id marks it done (a retry changes nothing).

The arithmetic is the in-process limiter's (``proxy.limits.rates``, ``meters``,
``periods``), written once more in Lua because it must run inside the store:

* rates are GCRA, one key holding the theoretical arrival time, expiring once it is past;
* calendar budgets are one hash per period (its start in the key name), expiring a day
  after the period ends: ``u:<replica>`` (what that replica billed), ``used`` (their
  sum), ``reserved`` (held by requests in flight);
* reservations at budgets and gates are also members ``<id>|<units>`` of a sorted set
  scored by their expiry, so a crashed replica's reservations are given back when they
  expire (``--limits-reservation-ttl``); nothing leaks. A live replica extends the holds
  of its requests still in flight (``renew``, from its heartbeat, one round trip for all
  of them), so a realtime session or a stream longer than the TTL keeps its hold.

The store is a cache of the journals. Each replica's part of a budget is its own
journal's total for the period, so a replica writes it as a total (raised, never added
to): a store that restarts empty is rebuilt by every replica contributing its journal
(``sync``), and no reservation is made on it until the generation is complete (see
``storescripts``): meanwhile the replicas admit in their fail mode.

A reservation whose answer was lost is cancelled by its id (``finish`` with ``cancel``); a
settlement whose sending failed is in this replica's total from then on, and the next
contribution to carry it claims its id (``unclaimed``), so that its first sending, should
it still reach the store, adds nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import structlog
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from proxy.limits.history import History, bucket_of, matches
from proxy.limits.limiter import (
    Cost,
    Decision,
    Refusal,
    Standing,
    Ticket,
    Usage,
    Who,
    decision_of,
)
from proxy.limits.meters import GATE_RETRY_SECONDS, HELD_RETRY_SECONDS
from proxy.limits.periods import period
from proxy.limits.policy import RATE_SECONDS, Limit, Policies
from proxy.limitstore.scripts import BEAT, END, RENEW, RESERVE, STAMP, SYNC

log = structlog.get_logger("proxy.serving.sharedlimits")

# A budget's hash outlives its period by this much: a late settlement still lands.
BUDGET_GRACE_SECONDS = 86_400
# How long a settled or released id is remembered (a retry within it changes nothing).
DONE_SECONDS = 86_400
# The generation marker outlives every budget hash (a month and its grace), refreshed by
# each contribution and heartbeat: while it lives, the budgets in the store are whole.
GENERATION_SECONDS = 40 * 86_400


class Rebuilding(Exception):
    """The store's budgets are being rebuilt (a store found empty): no reservation is
    made on it until every replica has contributed its journal."""

    def __init__(self, contributed: bool) -> None:
        super().__init__("the limits store's budgets are being rebuilt")
        self.contributed = contributed  # whether this replica has already


@dataclass(frozen=True, slots=True)
class Synced:
    """What a contribution found: the store's generation, whether it is complete, and
    whether this contribution started it (the store was empty: a rebuild)."""

    generation: str
    complete: bool
    created: bool
    budgets: int  # budget hashes this replica wrote its total to


@dataclass(frozen=True, slots=True)
class Beat:
    """What a heartbeat read: the live replicas, how long this one has stayed in the
    registry, the store's time, and this replica's view of the generation marker."""

    count: int
    stayed: float  # seconds since this replica's current stay in the registry began
    now: float  # the store's clock
    generation: str | None
    contributed: bool  # whether this replica has contributed to that generation
    complete: bool


@dataclass(frozen=True, slots=True)
class Taken:
    """One level's part of a reservation in the store."""

    scope: tuple[str, ...]
    limit: Limit
    key: str
    holds: str
    kind: str  # r (rate), b (budget), g (gate)
    span: float  # a rate's window; a budget's period end (Unix seconds)
    start: float  # a budget's period start


@dataclass(slots=True)
class StoreTicket(Ticket):
    """A reservation in the store: its id and the keys it took from."""

    id: str = ""
    parts: list[Taken] = field(default_factory=list)
    noted: bool = False  # its billed units are in this replica's history
    generation: str | None = None  # the store's generation it was reserved in


class RedisLimiter:
    """``proxy.limits.limiter.Limiter`` on a Redis/Valkey store shared by replicas.
    ``reserve`` raises ``Rebuilding`` while the store's generation is incomplete."""

    def __init__(
        self,
        policies: Policies,
        client: Redis,
        *,
        namespace: str = "usage-proxy",
        replica: str = "replica",
        reservation_ttl: float = 600.0,
        grace: float = 15.0,
    ) -> None:
        self.policies = policies
        self.client = client
        self.namespace = namespace
        self.replica = replica
        self.reservation_ttl = reservation_ttl
        self.grace = grace  # an incomplete generation waits this long for unknown replicas
        self.history = History()  # this replica's billed usage: its part of each budget
        self.holds: dict[str, Ticket] = {}  # admitted without the store, not yet ended
        # settlements in the history whose sending to the store is under way (by ticket
        # id): left out of this replica's part until it has answered (``own``)
        self.sending: dict[str, tuple[Who, Cost, float]] = {}
        self.live: dict[str, StoreTicket] = {}  # reserved in the store, not yet ended
        # settlements whose sending failed (in this replica's total from then on) that no
        # contribution has carried yet: the next one to carry them claims their ids
        self.unclaimed: dict[str, StoreTicket] = {}
        self.generation: str | None = None  # the store's generation last contributed to
        # the budgets the limits file names, for these policies, until a period ends
        self._named: tuple[Policies, float, list[Taken]] | None = None
        self._reserve: Any = client.register_script(RESERVE)
        self._end: Any = client.register_script(END)
        self._sync: Any = client.register_script(SYNC)
        self._renew: Any = client.register_script(RENEW)
        self._stamp: Any = client.register_script(STAMP)
        self._beat: Any = client.register_script(BEAT)

    @property
    def generation_key(self) -> str:
        return f"{self.namespace}:gen"

    @property
    def registry_key(self) -> str:
        return f"{self.namespace}:replicas"

    @property
    def joined_key(self) -> str:
        return f"{self.namespace}:joined"

    def done_key(self, rid: str) -> str:
        return f"{self.namespace}:done:{rid}"

    def replace(self, policies: Policies) -> None:
        self.policies = policies

    def wants_tokens(self, tenant: str) -> bool:
        return self.policies.wants_tokens(tenant)

    def _key(self, scope: tuple[str, ...], limit: Limit, suffix: str) -> str:
        # {tenant}: every key of a tenant's levels in one hash slot
        rest = ":".join(scope[2:])
        return f"{self.namespace}:{{{scope[1]}}}:{scope[0]}:{rest}:{limit.name}{suffix}"

    def budget_key(self, scope: tuple[str, ...], limit: Limit, start: float) -> str:
        """The store's hash of a budget's period starting at ``start``."""
        return self._key(scope, limit, f":{int(start)}")

    def parts(self, who: Who, now: float) -> list[Taken]:
        """Every limit that applies to ``who``, with its keys in the store."""
        parts = []
        zone = self.policies.zone
        for level in self.policies.levels(who.tenant, who.model, who.key):
            for limit in level.limits:
                if limit.window is None:
                    kind, span, start, suffix = "g", 0.0, 0.0, ""
                elif limit.budget:
                    start, span = period(limit.window, now, zone)
                    kind, suffix = "b", f":{int(start)}"
                else:
                    kind, span, start, suffix = "r", float(RATE_SECONDS[limit.window]), 0.0, ""
                key = self._key(level.scope, limit, suffix)
                parts.append(Taken(level.scope, limit, key, key + ":holds", kind, span, start))
        return parts

    def own(self, part: Taken) -> int:
        """This replica's part of a budget: what it billed in the period, and what it
        holds in reservations it made without the store; settlements the store has not
        confirmed are left out (each adds itself there, see ``storescripts``)."""
        if part.kind != "b":
            return 0
        unit = part.limit.unit
        billed = self.history.used(part.scope, unit, part.start, part.span)
        held = sum(t.cost.of(unit) for t in self.holds.values() if matches(part.scope, t.who))
        sending = sum(
            cost.of(unit)
            for who, cost, at in self.sending.values()
            if matches(part.scope, who) and part.start <= bucket_of(at) < part.span
        )
        return billed + held - sending + self.orphaned(part)

    async def reserve(self, who: Who, cost: Cost, now: float) -> Decision:
        return await self.reserve_ticket(self.ticket(who, cost, now))

    def ticket(self, who: Who, cost: Cost, now: float) -> StoreTicket:
        """A reservation to ask the store for: its id (to cancel it by, should its answer
        be lost) and every limit that applies to ``who``."""
        return StoreTicket(who, cost, id=uuid.uuid4().hex, parts=self.parts(who, now))

    async def reserve_ticket(
        self, ticket: StoreTicket, left: dict[str, tuple[int, float, Taken]] | None = None
    ) -> Decision:
        """The store's decision on ``ticket`` (one round trip). ``left`` gets what is left
        in the store of each budget (by its key), this request included, and the store's
        time of the answer."""
        who, cost, parts = ticket.who, ticket.cost, ticket.parts
        if not parts:
            return Decision(Ticket(who, cost), None, None, None)
        claims = [t.id for t in self.unclaimed.values() if t.who.tenant == who.tenant]
        keys = [self.generation_key, self.registry_key, self.done_key(ticket.id)]
        keys += [self.done_key(rid) for rid in claims]
        args: list[Any] = [ticket.id, self.reservation_ttl, self.replica, len(parts)]
        args += [HELD_RETRY_SECONDS, GATE_RETRY_SECONDS, self.grace, len(claims), DONE_SECONDS]
        for part in parts:
            keys += [part.key, part.holds]
            expire = part.span + BUDGET_GRACE_SECONDS if part.kind == "b" else 0
            args += [
                part.kind,
                part.limit.amount,
                cost.of(part.limit.unit),
                part.span,
                self.own(part),
                expire,
            ]
        out = await self._reserve(keys=keys, args=args)
        if int(out[0]) == -2:
            raise ResponseError(f"reservation {ticket.id} was cancelled before it arrived")
        if int(out[0]) < 0:
            raise Rebuilding(bool(int(out[1])))
        self._claimed(claims)
        admitted, worst, worst_wait = int(out[0]), int(out[1]), float(out[2])
        standings = [(int(out[3 + 2 * i]), float(out[4 + 2 * i])) for i in range(len(parts))]
        if left is not None:
            for part, (remaining, reset) in zip(parts, standings, strict=True):
                if part.kind == "b":  # its reset is its period's end less the store's time
                    left[part.key] = (remaining, part.span - reset, part)
        told = [
            (part.scope, part.limit, Standing(part.limit.amount, remaining, reset))
            for part, (remaining, reset) in zip(parts, standings, strict=True)
        ]
        if not admitted:
            part = parts[worst - 1]
            limit = part.limit
            refusal = Refusal(
                limit.name,
                part.scope,
                worst_wait,
                cost.of(limit.unit),
                limit.amount,
                limit.budget,
            )
            return decision_of(None, refusal, told)
        ticket.generation = self.generation
        ticket.taken = [(p.scope, p.limit.name, p.limit.unit) for p in parts]
        if any(p.kind != "r" for p in parts):  # holds to keep while the request lives
            self.live[ticket.id] = ticket
        return decision_of(ticket, None, told)

    def _claimed(self, claims: list[str]) -> None:
        for rid in claims:
            self.unclaimed.pop(rid, None)

    async def settle(self, ticket: Ticket, billed: Cost, now: float) -> None:
        if not ticket.open:
            return
        self.note(ticket, billed, now)
        await self.finish(ticket, billed, "settle")
        self.ended(ticket)

    def note(self, ticket: Ticket, billed: Cost, now: float) -> None:
        """Add a settlement to this replica's history, once per reservation; one of a
        store reservation is sending until the store confirms it (``finish``)."""
        if isinstance(ticket, StoreTicket):
            if ticket.noted:
                return
            ticket.noted = True
            if ticket.parts:
                self.sending[ticket.id] = (ticket.who, billed, now)
        self.history.note(ticket.who, billed, now)

    async def release(self, ticket: Ticket, now: float) -> None:
        if not ticket.open:
            return
        await self.finish(ticket, Cost(0, 0, 0), "release")
        self.ended(ticket)

    def ended(self, ticket: Ticket) -> None:
        """The ticket's request ended: its holds are no longer renewed (its settlement or
        release gives them back, or else they expire by their TTL)."""
        ticket.open = False
        self.live.pop(getattr(ticket, "id", ""), None)

    async def beat(self, ttl: float) -> Beat:
        """This replica alive in the registry (replicas silent for ``ttl`` dropped), the
        generation marker kept alive (no-op on one that is gone) and read; one round
        trip."""
        async with self.client.pipeline(transaction=True) as pipe:
            await self._beat(
                keys=[self.registry_key, self.joined_key], args=[self.replica, ttl], client=pipe
            )
            pipe.hmget(self.generation_key, "id", "c:" + self.replica, "complete")
            pipe.expire(self.generation_key, GENERATION_SECONDS)
            result = await pipe.execute()
        count, joined, now = result[0]
        generation, mine, complete = (v.decode() if v else None for v in result[1])
        return Beat(
            int(count),
            float(now) - float(joined),
            float(now),
            generation,
            mine is not None,
            complete == "1",
        )

    async def went_back(self) -> bool:
        """Whether the store restarted with state from before its generation marker (a
        snapshot, a failover): the marker is then dropped, and the next contribution
        starts a generation (a rebuild). False when the store does not tell its run
        (``INFO`` refused): then only a store found empty is rebuilt."""
        try:
            info = await self.client.info("server")
        except ResponseError:
            return False
        run = info.get("run_id")
        if not run:
            return False
        return bool(int(await self._stamp(keys=[self.generation_key], args=[str(run)])))

    async def renew(self) -> tuple[int, int]:
        """Extend the holds of every reservation still alive to a whole TTL from now, in
        one round trip; (holds extended, holds asked). A hold already given back (it
        expired first, e.g. the store was unreachable for a TTL) is not taken again."""
        keys: list[str] = []
        args: list[Any] = [self.reservation_ttl]
        for rid, ticket in list(self.live.items()):
            if not ticket.open:
                del self.live[rid]
                continue
            for part in ticket.parts:
                if part.kind == "r":
                    continue
                keys += [part.key, part.holds]
                args.append(f"{rid}|{ticket.cost.of(part.limit.unit)}")
        if not keys:
            return 0, 0
        renewed = int(await self._renew(keys=keys, args=args))
        return renewed, len(args) - 1

    async def finish(self, ticket: Ticket, billed: Cost, mode: str) -> bool:
        """End a store reservation; whether this was its id's first end. Its holds are
        given back once whatever the mode; the first end of an id (or none, see
        ``unclaimed``) adds units and gives rate capacity back: ``settle`` adds its billed
        units to this replica's part of each budget; ``release`` gives it all back;
        ``late`` is a settlement sent again after its first sending failed: its billed
        units are in this replica's part by then (contributed as its total, see ``own``),
        so it adds nothing; ``cancel`` ends a reservation whose answer was lost (it may
        never have been made): its holds given back, the reservation refused should it
        arrive later, its rates left as they are (they refill)."""
        if not isinstance(ticket, StoreTicket) or not ticket.parts:
            return False
        keys = [self.done_key(ticket.id)]
        args: list[Any] = [ticket.id, self.replica, len(ticket.parts), DONE_SECONDS, mode]
        for part in ticket.parts:
            keys += [part.key, part.holds]
            unit = part.limit.unit
            interval = part.span / part.limit.amount if part.kind == "r" else 0
            args += [
                part.kind,
                ticket.cost.of(unit),
                billed.of(unit),
                interval,
                part.span + BUDGET_GRACE_SECONDS if part.kind == "b" else 0,
            ]
        try:
            first = bool(int(await self._end(keys=keys, args=args)))
        finally:  # added there, or to be contributed in this replica's part
            self.sending.pop(ticket.id, None)
        self.unclaimed.pop(ticket.id, None)  # its id is done now: nothing can add it again
        return first

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
        starting a generation if the store has none; ``known``: the replicas the operator
        declared (0: none), whom a new generation waits for (else for its grace)."""
        parts = self.budgets(now)
        claims = list(self.unclaimed)
        keys = [self.generation_key, self.registry_key]
        keys += [self.done_key(rid) for rid in claims] + [p.key for p in parts]
        args: list[Any] = [self.replica, known, self.grace, GENERATION_SECONDS]
        args += [uuid.uuid4().hex, len(parts), self.generation or ""]
        args += [len(claims), DONE_SECONDS]
        for part in parts:
            own = self.own(part)
            # in a generation new to this replica, every request in flight it reserved in
            # the store is in its part: the store that held those reservations is gone
            fresh = own - self.orphaned(part) + self.in_flight(part, lambda _: True)
            args += [own, fresh, part.span + BUDGET_GRACE_SECONDS]
        out = await self._sync(keys=keys, args=args)
        self._claimed(claims)
        generation = out[0].decode() if isinstance(out[0], bytes) else str(out[0])
        self.generation = generation
        return Synced(generation, bool(int(out[1])), bool(int(out[2])), len(parts))

    def orphaned(self, part: Taken) -> int:
        """What the requests in flight this replica reserved in a store state that is gone
        (a generation before the current one) hold of a budget."""
        return self.in_flight(part, lambda t: t.generation != self.generation)

    def in_flight(self, part: Taken, which: Callable[[StoreTicket], bool]) -> int:
        unit = part.limit.unit
        return sum(
            t.cost.of(unit)
            for t in self.live.values()
            if t.open and which(t) and matches(part.scope, t.who)
        )

    async def restore(self, history: Iterable[Usage], now: float) -> int:
        taken = 0
        for usage in history:
            self.history.note(usage.who, usage.cost, usage.at)
            taken += 1
        return taken
