"""Limits shared by every replica on one Redis or Valkey store (``--limits-store``).

Each admission is one round trip: one Lua script (``scripts``) checks every level
that applies (tenant, tenant x model, key) on the store's clock (``TIME``) and reserves
at all of them or none, answering what the ``x-ratelimit-*`` headers need. Settlement and
release are one round trip each and idempotent: a ticket carries a reservation id, and
the first settle or release of an id marks it done (a retry changes nothing).

The arithmetic is the in-process limiter's (``proxy.limits.rates``, ``meters``,
``periods``), written once more in Lua because it must run inside the store. The keys it
keeps are told in ``keyspace``. A live replica extends the holds of its requests still in
flight (``renew``, from its heartbeat, one round trip for all of them), so a realtime
session or a stream longer than the TTL keeps its hold.

The store is a cache of the journals: each replica writes its part of a budget as its
journal's total (``parts``), so a store that restarts empty is rebuilt by every replica
contributing its journal (``sync``), and no reservation is made on it until the
generation is complete (see ``scripts``): meanwhile the replicas admit in their fail mode.

A reservation whose answer was lost is cancelled by its id (``finish`` with ``cancel``); a
settlement whose sending failed is in this replica's total from then on, and the next
contribution to carry it claims its id (``unclaimed``), so that its first sending, should
it still reach the store, adds nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from proxy.limits.limiter import (
    Cost,
    Decision,
    LimitStanding,
    Refusal,
    Standing,
    StandingUnknown,
    Ticket,
    Usage,
    Who,
    decision_of,
)
from proxy.limits.meters import GATE_RETRY_SECONDS, HELD_RETRY_SECONDS
from proxy.limits.policy import Policies
from proxy.limitstore.keyspace import Keyspace
from proxy.limitstore.parts import ReplicaParts
from proxy.limitstore.scripts import BEAT, END, RENEW, RESERVE, STAMP, SYNC
from proxy.limitstore.store_standings import standings, tenant_parts
from proxy.limitstore.tickets import (
    BUDGET_GRACE_SECONDS,
    DONE_SECONDS,
    GENERATION_SECONDS,
    Beat,
    LocalTicket,
    Rebuilding,
    StoreTicket,
    Synced,
    Taken,
)


class RedisLimiter:
    """``proxy.limits.limiter.Limiter`` on a Redis/Valkey store shared by replicas, the
    only one to speak to the store (through ``client``). ``reserve`` raises
    ``Rebuilding`` while the store's generation is incomplete."""

    shared_store = True

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
        self.keys = Keyspace(namespace)
        self.replica = replica
        self.reservation_ttl = reservation_ttl
        self.grace = grace  # an incomplete generation waits this long for unknown replicas
        self.book = ReplicaParts(self.keys, lambda: self.policies)
        self.generation: str | None = None  # the store's generation last contributed to
        self._reserve: Any = client.register_script(RESERVE)
        self._end: Any = client.register_script(END)
        self._sync: Any = client.register_script(SYNC)
        self._renew: Any = client.register_script(RENEW)
        self._stamp: Any = client.register_script(STAMP)
        self._beat: Any = client.register_script(BEAT)

    def replace(self, policies: Policies) -> None:
        self.policies = policies

    def wants_tokens(self, tenant: str) -> bool:
        return self.policies.wants_tokens(tenant)

    def parts(self, who: Who, now: float) -> list[Taken]:
        """Every limit that applies to ``who``, with its keys in the store."""
        return self.book.parts(who, now)

    def budget_key(self, scope: tuple[str, ...], limit: Any, start: float) -> str:
        return self.keys.budget(scope, limit, start)

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
        claims = [t.id for t in self.book.unclaimed.values() if t.who.tenant == who.tenant]
        keys = [self.keys.generation, self.keys.registry, self.keys.done(ticket.id)]
        keys += [self.keys.done(rid) for rid in claims]
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
                self.book.own(part),
                expire,
            ]
        out = await self._reserve(keys=keys, args=args)
        if int(out[0]) == -2:
            raise ResponseError(f"reservation {ticket.id} was cancelled before it arrived")
        if int(out[0]) < 0:
            raise Rebuilding(bool(int(out[1])))
        self.book.claimed(claims)
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
        ticket.reserved_in(self.generation)
        if any(p.kind != "r" for p in parts):  # holds to keep while the request lives
            self.book.live[ticket.id] = ticket
        return decision_of(ticket, None, told)

    async def standing(self, tenant: str, now: float) -> list[LimitStanding]:
        """What the store holds of ``tenant``'s limits now: the store's clock, then every
        key in one transaction (``StandingUnknown`` while its budgets are being rebuilt:
        they are not whole)."""
        parts = tenant_parts(self.policies, self.parts, tenant, now)
        seconds, micros = await self.client.time()
        clock = float(seconds) + float(micros) / 1_000_000  # the store's, as its scripts read it
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hget(self.keys.generation, "complete")
            for part in parts:
                if part.kind == "r":
                    pipe.get(part.key)
                else:  # the holds expired by ``clock`` only: those in flight may be many
                    pipe.hmget(part.key, "used", "reserved")
                    pipe.zrangebyscore(part.holds, "-inf", clock)
            answers: list[Any] = await pipe.execute()
        if answers[0] not in (b"1", "1"):
            raise StandingUnknown("the limits store's budgets are being rebuilt")
        return standings(parts, answers[1:], clock)

    async def settle(self, ticket: Ticket, billed: Cost, now: float) -> None:
        if not ticket.open:
            return
        self.book.note(ticket, billed, now)
        await self.finish(ticket, billed, "settle")
        self.book.ended(ticket)

    async def release(self, ticket: Ticket, now: float) -> None:
        if not ticket.open:
            return
        await self.finish(ticket, Cost(0, 0, 0), "release")
        self.book.ended(ticket)

    async def restore(self, history: Iterable[Usage], now: float) -> int:
        taken = 0
        for usage in history:
            self.book.history.note(usage.who, usage.cost, usage.at)
            taken += 1
        return taken

    async def beat(self, ttl: float) -> Beat:
        """This replica alive in the registry (replicas silent for ``ttl`` dropped), the
        generation marker kept alive (no-op on one that is gone) and read; one round
        trip."""
        async with self.client.pipeline(transaction=True) as pipe:
            await self._beat(
                keys=[self.keys.registry, self.keys.joined], args=[self.replica, ttl], client=pipe
            )
            pipe.hmget(self.keys.generation, "id", "c:" + self.replica, "complete")
            pipe.expire(self.keys.generation, GENERATION_SECONDS)
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
        return bool(int(await self._stamp(keys=[self.keys.generation], args=[str(run)])))

    async def renew(self) -> tuple[int, int]:
        """Extend the holds of every reservation still alive to a whole TTL from now, in
        one round trip; (holds extended, holds asked). A hold already given back (it
        expired first, e.g. the store was unreachable for a TTL) is not taken again."""
        keys, members = self.book.renewal()
        if not keys:
            return 0, 0
        renewed = int(await self._renew(keys=keys, args=[self.reservation_ttl, *members]))
        return renewed, len(members)

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
        keys = [self.keys.done(ticket.id)]
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
            self.book.sending.pop(ticket.id, None)
        self.book.unclaimed.pop(ticket.id, None)  # its id is done now: nothing can add it again
        return first

    async def sync(self, known: int, now: float, *, seen: int = 0) -> Synced:
        """Contribute this replica's part of every budget to the store (one round trip),
        starting a generation if the store has none, and take the holds of its requests in
        flight there: those admitted without the store, and, in a generation new to this
        replica, those reserved in the store state that is gone. ``known``: the replicas
        the operator declared (0: none), whom a new generation waits for (else its grace);
        ``seen``: as many as this replica counted, for whom it need not wait the grace."""
        sent = self.book.contribution(now)
        held = sent.holds()
        keys = [self.keys.generation, self.keys.registry]
        keys += [self.keys.done(rid) for rid in sent.claims] + [p.key for p in sent.parts]
        args: list[Any] = [self.replica, known or -seen, self.grace, GENERATION_SECONDS]
        args += [uuid.uuid4().hex, len(sent.parts), self.generation or ""]
        args += [len(sent.claims), DONE_SECONDS, self.reservation_ttl, len(held)]
        args += self.book.budget_args(sent.parts)
        for ticket, part, always in held:
            keys += [part.key, part.holds, self.keys.done(ticket.id)]
            units = ticket.cost.of(part.limit.unit)
            expire = part.span + BUDGET_GRACE_SECONDS if part.kind == "b" else 0
            args += [f"{ticket.id}|{units}", units, expire, always]
        out = await self._sync(keys=keys, args=args)
        generation = out[0].decode() if isinstance(out[0], bytes) else str(out[0])
        self.book.contributed(sent, generation)
        self.generation = generation
        return Synced(generation, bool(int(out[1])), bool(int(out[2])), len(sent.parts))

    async def read_budgets(self, parts: list[Taken]) -> tuple[float, list[int]]:
        """What is used and reserved of each budget of ``parts``, and the store's time of
        the read (one round trip)."""
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.time()
            for part in parts:
                pipe.hmget(part.key, "used", "reserved")
            result = await pipe.execute()
        now = float(result[0][0]) + float(result[0][1]) / 1e6
        return now, [int(used or 0) + int(reserved or 0) for used, reserved in result[1:]]

    async def close(self) -> None:
        await self.client.aclose()
