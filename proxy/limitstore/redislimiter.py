"""Limits shared by every replica on one Redis or Valkey store (``--limits-store``).

Each admission is one round trip: one Lua script (``scripts``) checks every level
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
``scripts``): meanwhile the replicas admit in their fail mode.

A reservation whose answer was lost is cancelled by its id (``finish`` with ``cancel``); a
settlement whose sending failed is in this replica's total from then on, and the next
contribution to carry it claims its id (``unclaimed``), so that its first sending, should
it still reach the store, adds nothing.
"""

from __future__ import annotations

import uuid
from typing import Any

from redis.exceptions import ResponseError

from proxy.limits.limiter import (
    Cost,
    Decision,
    LimitStanding,
    Refusal,
    Standing,
    Ticket,
    Who,
    decision_of,
)
from proxy.limits.meters import GATE_RETRY_SECONDS, HELD_RETRY_SECONDS
from proxy.limitstore.parts import ReplicaParts
from proxy.limitstore.readings import store_standing
from proxy.limitstore.tickets import (
    BUDGET_GRACE_SECONDS,
    DONE_SECONDS,
    GENERATION_SECONDS,
    Beat,
    LocalTicket,
    Rebuilding,
    StoreTicket,
    Taken,
)


class RedisLimiter(ReplicaParts):
    """``proxy.limits.limiter.Limiter`` on a Redis/Valkey store shared by replicas.
    ``reserve`` raises ``Rebuilding`` while the store's generation is incomplete."""

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

    async def standing(self, tenant: str, now: float) -> list[LimitStanding]:
        return await store_standing(self, tenant, now)

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
        for rid in [rid for rid, t in self.live.items() if not t.open]:
            del self.live[rid]
        adopted = [t for t in self.holds.values() if isinstance(t, LocalTicket) and t.adopted]
        alive: list[StoreTicket | LocalTicket] = [*self.live.values(), *adopted]
        for each in alive:
            for part in each.parts:
                if part.kind == "r":
                    continue
                keys += [part.key, part.holds]
                args.append(f"{each.id}|{each.cost.of(part.limit.unit)}")
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
        arrive later, its rates left as they are (they refill). A request admitted
        without the store ends as ``late`` or ``release``: its holds (taken by a
        contribution) given back, its bill in this replica's part."""
        if not isinstance(ticket, StoreTicket | LocalTicket) or not ticket.parts:
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
