"""This replica's heartbeat in the store: alive in the registry, whose live count local
fail mode divides by (once this replica has stayed a registry TTL in it, unless
``--limits-replicas`` states it), the store's generation kept and checked (a store back
from an old snapshot is rebuilt), the remainders read, and the holds of the requests in
flight renewed."""

from __future__ import annotations

import asyncio

import structlog

from proxy.limitstore.breaker import STORE_ERRORS
from proxy.limitstore.contribution import Contribution

log = structlog.get_logger("proxy.limitstore.heartbeat")


class Heartbeat(Contribution):
    """The heartbeat's round trips and the replica count they give."""

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
        clock = self._clock()
        # beat within the registry's TTL of the last: the others have counted this
        # replica all along (a stay that began anew is the store's registry lost)
        continuous = self.beaten is not None and clock - self.beaten <= ttl
        self.beaten, self.failing_since, self.registry_ttl = clock, None, ttl
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
        self._count(beat.count, beat.stayed >= ttl, continuous)
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

    def _count(self, live: int, settled: bool, continuous: bool) -> None:
        """Divide by the configured count, else by the live one once this replica has
        stayed a registry TTL in the store (every replica that stayed as long is in it;
        one that joined later has not stayed as long, and refuses); before that the count
        is not known, but for a replica that was counted and has beaten all along: its
        stay began anew because the store lost its registry (restarted empty), and the
        count read before still divides (by no fewer than the live one) until its new
        stay is a TTL long."""
        if self.configured:
            self.set_replicas(self.configured)
            return
        if settled:
            self.counted = True
            self.set_replicas(live)
            return
        self.counted = self.counted and continuous
        self.set_replicas(max(self.replicas, live))
