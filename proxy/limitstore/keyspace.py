"""Where the shared limiter keeps each limit in the store, and its state in this replica:
the key names (every key of a tenant's levels in one hash slot), the parts a reservation
takes (every limit that applies, with its keys, kind and period), the scripts registered,
and what this replica billed, holds and has in flight (``RedisLimiter``'s base)."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from proxy.limits.history import History
from proxy.limits.limiter import Cost, Ticket, Who
from proxy.limits.periods import period
from proxy.limits.policy import RATE_SECONDS, Limit, Policies
from proxy.limitstore.scripts import BEAT, END, RENEW, RESERVE, STAMP, SYNC
from proxy.limitstore.tickets import StoreTicket, Taken


class StoreLayout:
    """The shared limiter's keys in the store and its state in this replica."""

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
