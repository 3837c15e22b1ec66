"""The guarded limiter's state, and what the store last said was used of each budget,
kept for local fail mode: from each admission's answer and each heartbeat's read, ordered
by the store's clock, and only when the store knows every admission this replica made
without it (contributed); a replica's share is of what is left of the amount in force,
less what it admitted without the store since."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

import structlog

from proxy.limits.history import matches
from proxy.limits.limiter import Cost, Ticket
from proxy.limits.periods import period
from proxy.limits.policy import FailMode, Limit, Policies, Unit
from proxy.limitstore.breaker import STORE_ERRORS, Breaker
from proxy.limitstore.divided import ShareLimiter
from proxy.limitstore.redislimiter import RedisLimiter
from proxy.limitstore.tickets import Left, Taken
from proxy.metrics import Metrics

log = structlog.get_logger("proxy.limitstore.remainders")


class Remainders:
    """The guarded limiter's state (every attribute its concerns share), and the
    remainders it keeps of the budgets it watches."""

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
            shared.policies.divided(self.replicas),
            self._left_of,
            self._took_of,
            self._whole_of,
            self._in_flight,
        )
        self._taking: list[tuple[str, Left, Unit, int]] = []  # the local admission being made
        # what was left of each budget in the store when it last said so, by its key
        self.left: dict[str, Left] = {}
        self.seq = 0  # local admissions so far (a remainder is after those up to its own)
        self.heard = float("-inf")  # the store's time when it last answered this replica
        # this replica's last successful heartbeat and when the store stopped answering
        # since (this process's clock), and the registry's TTL: a replica silent longer
        # than it may be missing from the others' count
        self.beaten: float | None = None
        self.failing_since: float | None = None
        self.registry_ttl = 15.0
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

    def _remember(self, left: dict[str, tuple[int, float, Taken]], seq: int) -> None:
        """Keep what the store said was left of budgets, when it knows every admission
        this replica made without it (the contribution in the same call covers those up
        to ``seq``; one made while the call was out may not be in it), unless it said
        something later already."""
        if self.seq != seq:
            return
        for key, (remaining, at, part) in left.items():
            self.heard = max(self.heard, at)
            self._keep(key, Left(part.limit.amount - remaining, at, seq, part.span))

    def _keep(self, key: str, left: Left) -> None:
        old = self.left.get(key)
        if old is None or old.at <= left.at:
            self.left[key] = left

    def _remainder(self, key: str, limit: Limit, start: float, end: float) -> Left | None:
        """What the store last said was used of a budget's period; for a period that began
        after the store last answered this replica (it has, since this process started),
        nothing (nothing was spent in it through the store as far as this replica can
        know); else None."""
        left = self.left.get(key)
        if left is None and math.isfinite(self.heard) and start > self.heard:
            left = self.left[key] = Left(0, start, self.seq, end)
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
        remainder = max(self._whole_of(scope, limit) - left.consumed, 0)
        return remainder // self.replicas - left.spent, remainder

    def _whole_of(self, scope: tuple[str, ...], limit: Limit) -> int:
        """The amount in force of ``limit`` at ``scope`` (local mode's meters hold its
        share: a refusal and the headers quote the whole)."""
        return self._whole_named(scope, limit.name, limit.amount)

    def _whole_named(self, scope: tuple[str, ...], name: str, default: int) -> int:
        levels = self.shared.policies.levels(scope[1], *_model_key(scope))
        for level in levels:
            if level.scope == scope:
                for whole in level.limits:
                    if whole.name == name:
                        return whole.amount
        return default

    def _in_flight(self, scope: tuple[str, ...]) -> int:
        """The requests this replica has in flight through the store at ``scope``: local
        mode's gate counts them with its own (they hold the store's gate)."""
        return sum(1 for t in self.shared.live.values() if t.open and matches(scope, t.who))

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
            key = self.shared.budget_key(scope, limit, start)
            self._taking.append((key, left, limit.unit, units))

    async def _read_left(self) -> None:
        """Read what is left of every budget this replica watches (one round trip, apart
        from the heartbeat's, so that a long read never makes the replica look gone),
        when every admission it made without the store is in the store (contributed);
        remainders of periods past are dropped."""
        shared, seq = self.shared, self.seq
        if self.dirty or (self._syncing and not self._syncing.done()):
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
            consumed = int(used or 0) + int(reserved or 0)
            self._keep(part.key, Left(consumed, now, seq, part.span))
        for key in [k for k, left in self.left.items() if left.end <= now]:
            del self.left[key]


def _model_key(scope: tuple[str, ...]) -> tuple[str | None, str | None]:
    """The model and key a level's scope names (for ``Policies.levels``)."""
    kind = scope[0]
    return (scope[2] if kind == "model" else None, scope[2] if kind == "key" else None)
