"""The shared limiter as admission uses it: behind a short timeout and a circuit breaker,
with each tenant's fail mode while the store cannot answer for the budgets (unreachable,
or rebuilding after it was found empty), this replica's heartbeat in the store, and its
contribution of its journal to the store's budgets. ``limitsstore`` builds it.

Local fail mode divides; it never multiplies. A replica admits by its share only when it
knows both what to divide and by how many: the replica count (``--limits-replicas``, else
the live count of the last heartbeat the store answered once this replica had stayed a
whole registry TTL in it, so that every replica that stayed as long is in the count) and,
for a budget, what the store last told it was left of it (or the whole amount for a
period that began after the store last answered it). A limit it cannot divide refuses
(503), logged and counted."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

import structlog
from redis.exceptions import RedisError

from proxy.limits.limiter import Cost, Decision, Refusal, Ticket, Usage, Who
from proxy.limits.periods import period
from proxy.limits.policy import FailMode, Level, Limit, Policies, Unit
from proxy.limitstore.divided import ShareLimiter
from proxy.limitstore.redislimiter import RedisLimiter
from proxy.limitstore.tickets import Rebuilding, StoreTicket, Taken
from proxy.metrics import Metrics

log = structlog.get_logger("proxy.serving.storeguard")
T = TypeVar("T")

STORE_ERRORS = (RedisError, OSError, TimeoutError)
MISSED_HELD = 10_000  # missed settlements and releases kept to send again
NOTHING = Cost(0, 0, 0)
UNCOUNTED = (
    "the replica count is not known (it is read once a replica has stayed a whole registry "
    "TTL, 15 s, in a store that answers; set --limits-replicas to state it)"
)


class Breaker:
    """Consecutive store failures open it for ``cooldown`` seconds: a dead or slow store
    costs each request nothing after the first failures. After the cooldown one request
    tries the store again (half open): a success closes it, a failure opens it again."""

    def __init__(self, failures: int = 3, cooldown: float = 1.0) -> None:
        self.failures = failures
        self.cooldown = cooldown
        self.count = 0
        self.open_until = 0.0

    @property
    def open(self) -> bool:
        return self.count >= self.failures

    def allows(self, now: float) -> bool:
        if not self.open:
            return True
        if now >= self.open_until:  # half open: this one request tries
            self.open_until = now + self.cooldown
            return True
        return False

    def failed(self, now: float) -> None:
        self.count += 1
        if self.open:
            self.open_until = now + self.cooldown

    def succeeded(self) -> bool:
        """Close; whether it was open (the store is back)."""
        was = self.open
        self.count = 0
        return was


@dataclass(slots=True)
class Left:
    """What was left of a budget's period (ending at ``end``) in the store (its amount
    less its used and reserved units) when it last said so (``at``, on the store's clock:
    answers read out of order do not replace a later one), after this replica's local
    admissions up to ``seq``; ``spent``: what this replica admitted without the store
    since (held, then billed)."""

    remaining: int
    at: float
    seq: int
    end: float
    spent: int = 0


@dataclass(slots=True)
class LocalTicket(Ticket):
    """A reservation made in this process while the store could not answer (``local`` or
    ``open``): held in this replica's part of the store's budgets until it ends, then
    billed there. ``charged``: the remainders it counts in (with its units there)."""

    id: str = ""
    inner: Ticket | None = None
    seq: int = 0
    charged: list[tuple[Left, Unit, int]] = field(default_factory=list)


class GuardedLimiter:
    """The shared limiter behind a short timeout and a circuit breaker, with the fail
    mode of each tenant while the store cannot answer: ``closed`` refuses (503),
    ``open`` admits, ``local`` enforces this replica's share in process (of what the
    store last said was left of each budget, else of the limit: ``proxy.limitstore.divided``).
    What is billed meanwhile is contributed to the store when it answers again (as this
    replica's total: a retry counts nothing twice)."""

    def __init__(
        self,
        shared: RedisLimiter,
        *,
        timeout: float,
        fail_mode: FailMode,
        replicas: int = 0,
        breaker: Breaker | None = None,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        slots: int = 8,
    ) -> None:
        self.shared = shared
        # requests' store calls in flight at once (the pool's connections for them): the
        # wait for a slot is not a store failure and does not count in ``timeout``
        self.slots = asyncio.Semaphore(slots)
        self.metrics = metrics
        self.timeout = timeout
        self.fail_mode = fail_mode
        self.breaker = breaker or Breaker()
        self.configured = max(replicas, 0)  # --limits-replicas (0: read from the store)
        self.replicas = max(self.configured, 1)  # what local fail mode divides by
        self.local = ShareLimiter(
            shared.policies.divided(self.replicas), self._left_of, self._took_of
        )
        self._taking: list[tuple[Left, Unit, int]] = []  # the local admission being made
        # what was left of each budget in the store when it last said so, by its key
        self.left: dict[str, Left] = {}
        self.seq = 0  # local admissions so far (a remainder is after those up to its own)
        self.heard = float("-inf")  # the store's time when it last answered this replica
        self.errors: dict[str, int] = {}  # store failures by kind
        self.fail_admissions: dict[FailMode, int] = dict.fromkeys(FailMode, 0)
        self.rebuilds = 0  # generations this replica started (the store was found empty)
        self.generation: str | None = None  # the last one this replica contributed to
        self.complete = False  # whether the store's budgets were whole when last told
        self.reachable = True  # whether the store answered the last call
        self.beating = True  # whether the last heartbeat reached the store
        # whether the replica count is known: configured, or read by the last heartbeat
        # the store answered once this replica had stayed a registry TTL in it
        self.counted = self.configured > 0
        self._warned: set[str] = set()  # limits local fail mode could not divide, logged
        # settlements and releases the store missed (breaker open, or failed), by ticket
        # id: sent again once it answers (each is idempotent by id)
        self.missed: dict[str, tuple[Ticket, Cost, str]] = {}
        self._replaying: asyncio.Task[None] | None = None
        self.restored = False  # this replica's journal read: it can contribute
        self.dirty = False  # billed without the store: to contribute
        self.slowest = 0.0  # the longest a store call took (failed ones included), seconds
        self._clock = clock
        self._syncing: asyncio.Task[bool] | None = None
        self._stale = True  # the local budgets re-read this replica's usage on next use

    @property
    def policies(self) -> Policies:
        return self.shared.policies

    @policies.setter
    def policies(self, policies: Policies) -> None:
        self.replace(policies)

    def replace(self, policies: Policies) -> None:
        self.shared.replace(policies)
        self.local.replace(policies.divided(self.replicas))

    def set_replicas(self, replicas: int) -> None:
        """The replica count local fail mode divides by."""
        replicas = max(replicas, 1)
        if replicas != self.replicas:
            self.replicas = replicas
            self.local.replace(self.shared.policies.divided(replicas))

    def wants_tokens(self, tenant: str) -> bool:
        return self.shared.wants_tokens(tenant)

    async def _call(self, op: str, call: Awaitable[T]) -> T:
        started = time.monotonic()
        try:
            async with asyncio.timeout(self.timeout):
                return await call
        finally:
            took = time.monotonic() - started
            self.slowest = max(self.slowest, took)
            if self.metrics is not None:
                self.metrics.store_seconds.labels(op).observe(took)

    def _failed(self, op: str, exc: BaseException) -> None:
        kind = "timeout" if isinstance(exc, TimeoutError) else type(exc).__name__
        self.errors[kind] = self.errors.get(kind, 0) + 1
        self.reachable = False
        self.breaker.failed(self._clock())
        if self.metrics is not None:
            self.metrics.store_errors.labels(kind).inc()
            self.metrics.store_breaker.set(int(self.breaker.open))
        log.warning("limits_store_failed", op=op, error=kind, breaker_open=self.breaker.open)

    def _succeeded(self) -> bool:
        """The store answered; whether the breaker was open (it is back)."""
        self.reachable = True
        if self.metrics is not None:
            self.metrics.store_breaker.set(0)
        return self.breaker.succeeded()

    def problem(self) -> tuple[str, bool] | None:
        """What /readyz reports about the store, and whether it fails readiness: when
        this replica refuses every limited request of the default fail mode while one
        that reaches the store (or can divide) would serve them. Unreachable: the last
        heartbeat failed or the breaker is open (one slow request is neither)."""
        local = self.fail_mode is FailMode.LOCAL
        if not self.beating or self.breaker.open:
            if self.fail_mode is FailMode.CLOSED:
                return "unreachable: limited tenants refused (fail mode closed)", True
            if local and not self.counted:
                return f"unreachable: limited tenants refused: {UNCOUNTED}", True
            if local:
                return (
                    "unreachable: limited tenants admitted by this replica's share of "
                    f"what the store last said was left of each limit (1/{self.replicas}; "
                    "a budget with no such remainder is refused)",
                    False,
                )
            return "unreachable: limited tenants admitted without limits (fail mode open)", False
        if self.generation is not None and not self.complete:
            return "rebuilding: the store was found empty; waiting for every replica's part", False
        if local and not self.counted:
            return f"counting replicas: were the store to fail now, {UNCOUNTED}", False
        return None

    def _back(self) -> None:
        self._stale = True
        if self._succeeded() or self.dirty:
            log.info("limits_store_back", dirty=self.dirty, missed=len(self.missed))
            self._contribute_soon()
        if self.missed and (self._replaying is None or self._replaying.done()):
            self._replaying = asyncio.get_running_loop().create_task(self._replay(None))

    def _miss(self, ticket: Ticket, billed: Cost, mode: str) -> None:
        """An end the store did not get: kept to send again (the oldest dropped beyond
        MISSED_HELD; its reservation then expires by its TTL)."""
        key = getattr(ticket, "id", "")
        if not key:
            return
        if len(self.missed) >= MISSED_HELD:
            del self.missed[next(iter(self.missed))]
        self.missed[key] = (ticket, billed, mode)

    async def _replay(self, tenant: str | None) -> None:
        """Send the missed ends again (a tenant's only, inline in its admission, or all,
        each in a slot); one that fails is kept for the next time."""
        keys = [k for k, (t, _, _) in self.missed.items() if tenant in (None, t.who.tenant)]
        for key in keys:
            end = self.missed.get(key)
            if end is None:
                continue
            ticket, billed, mode = end
            op = _op(mode)
            try:
                if tenant is None:
                    async with self.slots:
                        await self._call(op, self.shared.finish(ticket, billed, mode))
                else:
                    await self._call(op, self.shared.finish(ticket, billed, mode))
            except STORE_ERRORS as exc:
                self._failed(op, exc)
                return
            # kept until sent: an admission's timeout (a cancellation) leaves it here
            self.missed.pop(key, None)

    def _contribute_soon(self) -> None:
        if self.restored and (self._syncing is None or self._syncing.done()):
            self._syncing = asyncio.get_running_loop().create_task(self._sync(time.time()))

    async def reserve(self, who: Who, cost: Cost, now: float) -> Decision:
        """The store's decision within one ``timeout`` in all (a reservation, and on a
        store found empty this replica's contribution and a second try), else the fail
        mode's."""
        try:
            async with self.slots:
                await asyncio.sleep(0)  # the tasks queued before this one run first
                async with asyncio.timeout(self.timeout):  # from here: a slot held
                    decision = await self._reserve_in_store(who, cost, now)
        except TimeoutError as exc:  # the round trips together outlasted the timeout
            self._failed("reserve", exc)
            decision = None
        return decision if decision is not None else await self._fail(who, cost, now)

    async def _reserve_in_store(self, who: Who, cost: Cost, now: float) -> Decision | None:
        """The store's decision; None when it cannot answer for the budgets (unreachable,
        or their generation incomplete: every tenant then has its fail mode). A
        reservation whose answer is lost is cancelled once the store answers again."""
        for attempt in (0, 1):
            if not self.breaker.allows(self._clock()):
                return None
            if self.missed:  # the tenant's ends the store missed free their holds first
                await self._replay(who.tenant)
            seq, left = self.seq, dict[str, tuple[int, float, Taken]]()
            ticket = self.shared.ticket(who, cost, now)
            try:
                decision = await self._call("reserve", self.shared.reserve_ticket(ticket, left))
            except Rebuilding as exc:
                self._back()
                self.complete = False
                if attempt or exc.contributed:
                    return None
                await self.contribute()
            except STORE_ERRORS as exc:
                self._miss(ticket, NOTHING, "cancel")
                self._failed("reserve", exc)
                return None
            except BaseException:  # cancelled (the admission's timeout, or shutdown)
                self._miss(ticket, NOTHING, "cancel")
                raise
            else:
                self._back()
                self.complete = True
                self._remember(left, seq)
                return decision
        return None

    def _count_fail(self, mode: FailMode, reason: str) -> None:
        self.fail_admissions[mode] += 1
        if self.metrics is not None:
            self.metrics.fail_admissions.labels(mode.value, reason).inc()

    async def _fail(self, who: Who, cost: Cost, now: float) -> Decision:
        mode = self.shared.policies.fail_mode(who.tenant, self.fail_mode)
        levels = self.shared.policies.levels(who.tenant, who.model, who.key)
        if mode is FailMode.LOCAL and not self.counted and any(x.limits for x in levels):
            # no share can be computed: dividing by what it saw may give it the whole budget
            return self._undivided(who, "replicas_unknown", UNCOUNTED)
        if mode is FailMode.LOCAL and (budget := self._undividable(levels, now)) is not None:
            scope, limit = budget
            why = (
                f"this replica holds no remainder of {limit.name} of {':'.join(scope)} from "
                "the store to divide (a tenant it has not served, or the store found empty "
                "before it said what was left)"
            )
            return self._undivided(who, "no_remainder", why, f"{':'.join(scope)}:{limit.name}")
        self._count_fail(mode, "rebuilding" if self.reachable else "unreachable")
        if mode is FailMode.CLOSED:
            why = "the limits store is unreachable and this tenant's limits fail closed"
            return self._refused(who, why)
        if mode is FailMode.OPEN:
            return self._held(LocalTicket(who, cost, id=uuid.uuid4().hex), None)
        if self._stale:  # this replica's usage billed through the store counts here too
            self._stale = False
            await self.local.restore((), now)
        decision = await self.local.reserve(who, cost, now)
        if decision.ticket is None:
            return self._beyond_share(who, decision)
        ticket = LocalTicket(who, cost, id=uuid.uuid4().hex, inner=decision.ticket)
        return self._held(ticket, decision)

    def _undividable(
        self, levels: tuple[Level, ...], now: float
    ) -> tuple[tuple[str, ...], Limit] | None:
        """The first budget of ``levels`` local fail mode has no remainder of to divide."""
        zone = self.shared.policies.zone
        for level in levels:
            for limit in level.limits:
                if limit.window is not None and limit.budget:
                    start, end = period(limit.window, now, zone)
                    key = self.shared.budget_key(level.scope, limit, start)
                    if self._remainder(key, limit, start, end) is None:
                        return level.scope, limit
        return None

    def _undivided(self, who: Who, reason: str, why: str, what: str = "") -> Decision:
        """Refused by local fail mode: a limit it cannot divide (logged once per reason
        and limit until the store answers again, counted every time)."""
        self._count_fail(FailMode.LOCAL, reason)
        if (seen := f"{reason}:{what}") not in self._warned:
            self._warned.add(seen)
            log.warning("limits_local_refused", reason=reason, tenant=who.tenant, why=why)
        return self._refused(who, f"local fail mode cannot divide its limits: {why}")

    def _refused(self, who: Who, why: str) -> Decision:
        wait = max(self.breaker.cooldown, 1.0)  # a 503 always says when to try again
        scope = ("tenant", who.tenant)
        refusal = Refusal("limits_store", scope, wait, 0, 0, unavailable=True, why=why)
        return Decision(None, refusal, None, None)

    def _beyond_share(self, who: Who, decision: Decision) -> Decision:
        """A refusal by this replica's share quotes the whole limit; a request beyond the
        share but within the limit is refused for now (to retry once the store answers),
        not as one that can never be admitted."""
        refusal = decision.refusal
        if refusal is None or not refusal.alone or self.replicas <= 1:
            return decision
        levels = self.shared.policies.levels(who.tenant, who.model, who.key)
        whole = next(
            (
                limit.amount
                for level in levels
                if level.scope == refusal.scope
                for limit in level.limits
                if limit.name == refusal.limit
            ),
            refusal.amount,
        )
        wait = refusal.wait if refusal.cost > whole else self.breaker.cooldown
        refusal = Refusal(refusal.limit, refusal.scope, wait, refusal.cost, whole, False)
        return dataclasses.replace(decision, refusal=refusal)

    def _remember(self, left: dict[str, tuple[int, float, Taken]], seq: int) -> None:
        """Keep what the store said was left of budgets, when it knows every admission
        this replica made without it (the contribution in the same call covers those up
        to ``seq``; one made while the call was out may not be in it), unless it said
        something later already."""
        if self.seq != seq:
            return
        for key, (remaining, at, part) in left.items():
            self.heard = max(self.heard, at)
            self._keep(key, Left(remaining, at, seq, part.span))

    def _keep(self, key: str, left: Left) -> None:
        old = self.left.get(key)
        if old is None or old.at <= left.at:
            self.left[key] = left

    def _remainder(self, key: str, limit: Limit, start: float, end: float) -> Left | None:
        """What the store last said was left of a budget's period; for a period that began
        after the store last answered this replica, its whole amount (nothing was spent
        in it through the store as far as this replica can know); else None."""
        left = self.left.get(key)
        if left is None and start > self.heard:
            left = self.left[key] = Left(limit.amount, start, self.seq, end)
        return left

    def _period_left(self, scope: tuple[str, ...], limit: Limit, start: float) -> Left | None:
        assert limit.window is not None
        _, end = period(limit.window, start, self.shared.policies.zone)
        return self._remainder(self.shared.budget_key(scope, limit, start), limit, start, end)

    def _left_of(
        self, scope: tuple[str, ...], limit: Limit, start: float
    ) -> tuple[int, int] | None:
        """For local fail mode: this replica's room in its share of what the store last
        said was left of a budget, and that remainder (None: it never said)."""
        left = self._period_left(scope, limit, start)
        if left is None:
            return None
        return left.remaining // self.replicas - left.spent, left.remaining

    def _beyond_reserved(self, ticket: Ticket, billed: Cost) -> None:
        """A store reservation billed beyond what it reserved: the excess is not in the
        remainders the store told (they count the reservation), so it counts against
        them (the next remainder the store tells has it)."""
        for part in getattr(ticket, "parts", ()):
            left = self.left.get(part.key) if part.kind == "b" else None
            excess = billed.of(part.limit.unit) - ticket.cost.of(part.limit.unit)
            if left is not None and excess > 0:
                left.spent += excess

    def _took_of(self, scope: tuple[str, ...], limit: Limit, start: float, units: int) -> None:
        """A local admission takes ``units`` from a budget: counted against what the store
        last said was left of it (the admission's ticket keeps the charge)."""
        left = self._period_left(scope, limit, start)
        if left is not None:
            left.spent += units
            self._taking.append((left, limit.unit, units))

    def _held(self, ticket: LocalTicket, decision: Decision | None) -> Decision:
        self.seq += 1
        ticket.seq = self.seq
        ticket.charged, self._taking = self._taking, []
        self.shared.holds[ticket.id] = ticket
        if self.reachable and not self.breaker.open:  # rebuilding: the store learns of
            self.dirty = True  # the hold at once
            self._contribute_soon()
        if decision is None:
            return Decision(ticket, None, None, None)
        return dataclasses.replace(decision, ticket=ticket)

    async def settle(self, ticket: Ticket, billed: Cost, now: float) -> None:
        await self._end(ticket, billed, now, settle=True)

    async def release(self, ticket: Ticket, now: float) -> None:
        await self._end(ticket, Cost(0, 0, 0), now, settle=False)

    async def _end(self, ticket: Ticket, billed: Cost, now: float, *, settle: bool) -> None:
        if not ticket.open:
            return
        if isinstance(ticket, LocalTicket):
            await self._end_local(ticket, billed, now, settle=settle)
            return
        if settle:
            self.shared.note(ticket, billed, now)
            self.local.history.note(ticket.who, billed, now)
            self._stale = True  # a settlement after an outage began counts in its share
            self._beyond_reserved(ticket, billed)
        mode = "settle" if settle else "release"
        orphan = isinstance(ticket, StoreTicket) and ticket.generation != self.shared.generation
        self.shared.ended(ticket)  # else the store's reservation expires by its TTL
        if orphan:  # reserved in a store state that is gone: it was in this replica's part
            self.shared.sending.pop(getattr(ticket, "id", ""), None)  # its bill is, now
            mode = "late" if settle else mode
            self.dirty = True
        if self.breaker.allows(self._clock()):
            try:
                async with self.slots:
                    await self._call(_op(mode), self.shared.finish(ticket, billed, mode))
            except STORE_ERRORS as exc:
                self._failed(_op(mode), exc)
            except BaseException:  # cancelled (shutdown): kept to send, as a failure is
                self._unconfirmed(ticket, billed, mode, settle)
                raise
            else:
                self._back()
                if orphan:
                    self._contribute_soon()
                if settle and _crossed(ticket, now):
                    # the store added it to the period it was reserved in; the journal
                    # bills it in this one: this replica's part of it, at once
                    self.dirty = True
                    await self.contribute(now)
                return
        self._unconfirmed(ticket, billed, mode, settle)

    def _unconfirmed(self, ticket: Ticket, billed: Cost, mode: str, settle: bool) -> None:
        """An end the store did not confirm: a settlement is in this replica's part from
        now on (contributed as its total) and sent again ``late``, a release again as it
        is (see RedisLimiter.finish)."""
        self.shared.sending.pop(getattr(ticket, "id", ""), None)
        self._miss(ticket, billed, "late" if settle else mode)
        if settle and isinstance(ticket, StoreTicket):  # its first sending may still land
            self.shared.unclaimed[ticket.id] = ticket
        self.dirty = self.dirty or settle

    async def _end_local(
        self, ticket: LocalTicket, billed: Cost, now: float, *, settle: bool
    ) -> None:
        ticket.open = False
        for left, unit, units in ticket.charged:  # held until now; billed from now on
            left.spent += (billed.of(unit) if settle else 0) - units
        if ticket.inner is not None:
            if settle:
                await self.local.settle(ticket.inner, billed, now)
            else:
                await self.local.release(ticket.inner, now)
        elif settle:
            self.local.history.note(ticket.who, billed, now)
        if settle:
            self.shared.history.note(ticket.who, billed, now)
        del self.shared.holds[ticket.id]  # billed now, or given back
        self.dirty = True
        if self.breaker.allows(self._clock()):
            self._contribute_soon()

    async def contribute(self, now: float | None = None) -> bool:
        """Contribute this replica's part of every budget (of the periods ``now`` is in)
        to the store now (one sync at a time); whether the store's budgets are whole."""
        if not self.restored:
            return False
        if self._syncing is None or self._syncing.done():
            at = time.time() if now is None else now
            self._syncing = asyncio.get_running_loop().create_task(self._sync(at))
        return await asyncio.shield(self._syncing)

    async def _sync(self, now: float) -> bool:
        """Contribute; once more (twice at most) when this replica billed or admitted
        without the store while the call was out, so that the store learns of it now."""
        complete = False
        for _ in range(3):
            self.dirty = False  # what is billed from here on is in the next contribution
            try:
                synced = await self._call("sync", self.shared.sync(self.configured, now))
            except STORE_ERRORS as exc:
                self._failed("sync", exc)
                self.dirty = True
                return False
            self._succeeded()
            self._synced(synced.generation, synced.created, synced.budgets)
            complete = self.complete = synced.complete
            if not self.dirty:
                break
            now = time.time()
        return complete

    def _synced(self, generation: str, created: bool, budgets: int) -> None:
        if created:
            self.rebuilds += 1
            if self.metrics is not None:
                self.metrics.store_rebuilds.inc()
            log.warning(
                "limits_store_rebuild",
                generation=generation,
                budgets=budgets,
                expect=self.configured or "every replica alive after the grace",
            )
        if generation != self.generation:
            self.generation = generation
            log.info("limits_store_contributed", generation=generation, budgets=budgets)

    async def restore(self, history: Iterable[Usage], now: float) -> int:
        rows = list(history)
        await self.local.restore(rows, now)
        taken = await self.shared.restore(rows, now)
        self.restored = True
        self._contribute_soon()  # the store's budgets may be waiting for this replica's part
        return taken

    async def beat(self, ttl: float) -> int | None:
        """Tell the store this replica is alive, read what is left of the budgets it
        watches (for local fail mode), contribute to it when its budgets need this
        replica's part; the live replica count (None: store unreachable). ``ttl``: how
        long the registry keeps a silent replica."""
        shared = self.shared
        try:
            async with asyncio.timeout(max(self.timeout, 1.0)):
                beat = await shared.beat(ttl)
                went_back = await shared.went_back()
        except STORE_ERRORS as exc:
            self._failed("beat", exc)
            self.beating = False
            return None
        self.reachable = self.beating = True  # the breaker: requests' calls
        self.heard = max(self.heard, beat.now)
        self._warned.clear()
        generation, complete = beat.generation, beat.complete
        if went_back:
            log.warning(
                "limits_store_went_back",
                generation=generation,
                hint="the store restarted with state from before (a snapshot or a failover): "
                "its budgets are rebuilt from every replica's journal",
            )
            generation, complete = None, False
        self._count(beat.count, beat.stayed >= ttl)
        stale = generation is None or generation != self.generation or not beat.contributed
        if stale or self.dirty or not complete:
            complete = await self.contribute()
        if complete:
            self.complete = True  # the others' parts came in after this replica's
            await self._read_left()
        if self.metrics is not None:
            self.metrics.store_replicas.set(self.replicas if self.counted else 0)
            self.metrics.store_remainders.set(len(self.left))
        return beat.count

    async def _read_left(self) -> None:
        """Read what is left of every budget this replica watches (one round trip, apart
        from the heartbeat's, so that a long read never makes the replica look gone),
        when every admission it made without the store is in the store (contributed);
        remainders of periods past are dropped."""
        shared, seq = self.shared, self.seq
        if shared.holds or self.dirty or (self._syncing and not self._syncing.done()):
            return
        watched = shared.watched(time.time())
        try:
            async with asyncio.timeout(max(self.timeout, 1.0)):
                async with shared.client.pipeline(transaction=True) as pipe:
                    pipe.time()  # when the budgets below were read
                    for part in watched:
                        pipe.hmget(part.key, "used", "reserved")
                    result = await pipe.execute()
        except STORE_ERRORS as exc:  # the remainders kept stay: older, never wrong
            log.warning("limits_remainders_unread", error=type(exc).__name__)
            return
        if self.seq != seq:  # admitted without the store meanwhile: maybe not in the read
            return
        now = float(result[0][0]) + float(result[0][1]) / 1e6
        for part, (used, reserved) in zip(watched, result[1:], strict=True):
            remaining = part.limit.amount - int(used or 0) - int(reserved or 0)
            self._keep(part.key, Left(max(remaining, 0), now, seq, part.span))
        for key in [k for k, left in self.left.items() if left.end <= now]:
            del self.left[key]

    async def renew(self) -> int | None:
        """Extend the store's holds of this replica's requests still in flight (one round
        trip for all); the holds extended (None: the store did not answer)."""
        try:
            async with asyncio.timeout(max(self.timeout, 1.0)):
                renewed, asked = await self.shared.renew()
        except STORE_ERRORS as exc:
            self._failed("renew", exc)
            return None
        if renewed < asked:  # expired before this renewal (the store was away a TTL)
            log.warning("limits_holds_lost", asked=asked, renewed=renewed)
        return renewed

    def _count(self, live: int, settled: bool) -> None:
        """Divide by the configured count, else by the live one once this replica has
        stayed a registry TTL in the store (every replica that stayed as long is in it;
        one that joined later has not stayed as long, and refuses); before that the count
        is not known."""
        if self.configured:
            self.set_replicas(self.configured)
            return
        self.counted = settled
        self.set_replicas(live if settled else max(self.replicas, live))

    async def close(self) -> None:
        for task in (self._syncing, self._replaying):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.shared.client.aclose()


def _op(mode: str) -> str:
    """The store operation an end is counted as (metrics, logs): a ``late`` settlement is
    a settlement."""
    return "release" if mode == "release" else "settle"


def _crossed(ticket: Ticket, now: float) -> bool:
    """Whether a store reservation is settled after a budget period it was reserved in
    ended (a stream across midnight)."""
    return any(p.kind == "b" and not p.start <= now < p.span for p in getattr(ticket, "parts", ()))
