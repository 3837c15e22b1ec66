"""This replica in the store: its heartbeat in the registry, whose live count local fail
mode divides by (once this replica has stayed a registry TTL in it, unless
``--limits-replicas`` states it; the last count read is kept, ``headcount``), the store's
generation kept and checked (a store back from an old snapshot is rebuilt), the
remainders read, the holds of the requests in flight renewed; and what /readyz says of
the store."""

from __future__ import annotations

import asyncio
import time

import structlog

from proxy.limits.policy import FailMode
from proxy.limitstore.calls import StoreCalls
from proxy.limitstore.client import STORE_ERRORS
from proxy.limitstore.contribution import Contribution
from proxy.limitstore.failmodes import UNCOUNTED, LocalMode
from proxy.limitstore.headcount import CountFile
from proxy.limitstore.redislimiter import RedisLimiter
from proxy.metrics import Metrics

log = structlog.get_logger("proxy.limitstore.heartbeat")


class Heartbeat:
    """The heartbeat's round trips and the replica count they give."""

    def __init__(
        self,
        shared: RedisLimiter,
        calls: StoreCalls,
        contribution: Contribution,
        local: LocalMode,
        *,
        configured: int,
        metrics: Metrics | None,
        kept: CountFile | None = None,
    ) -> None:
        self._shared = shared
        self._calls = calls
        self._contribution = contribution
        self._local = local
        self._metrics = metrics
        self._kept = kept
        self.configured = max(configured, 0)  # --limits-replicas (0: read from the store)
        # the count this replica read before it restarted: it divides (no fewer than the
        # live count) until a count is read again
        self.recalled = 0 if self.configured or kept is None else kept.read()
        # whether the replica count is known: configured, recalled, or read by the last
        # heartbeat the store answered once this replica had stayed a registry TTL in it
        self.counted = bool(self.configured or self.recalled)
        self.beaten: float | None = None  # the last successful heartbeat (this process's clock)
        self.beating = True  # whether the last heartbeat reached the store
        # the registry's TTL: a replica silent longer than it may be missing from the
        # others' count
        self.registry_ttl = 15.0
        if self.counted:
            local.set_replicas(self.configured or self.recalled)
        self._expect()

    def _expect(self) -> None:
        """A generation new to the store waits for the replicas declared, or for as many
        as this replica counted (every one alive in the registry too), not its grace."""
        seen = self._local.replicas if self.counted and not self.configured else 0
        self._contribution.expect(self.configured, seen)

    async def beat(self, ttl: float) -> int | None:
        """Tell the store this replica is alive, read what is left of the budgets it
        watches (for local fail mode), contribute to it when its budgets need this
        replica's part; the live replica count (None: store unreachable). ``ttl``: how
        long the registry keeps a silent replica."""
        shared = self._shared
        try:
            async with asyncio.timeout(max(self._calls.timeout, 1.0)):
                beat = await shared.beat(ttl)
                went_back = await shared.went_back()
        except STORE_ERRORS as exc:
            self._calls.failed("beat", exc)
            self.beating = False
            return None
        self._calls.answered()  # the breaker: requests' calls
        self.beating = True
        clock = self._calls.clock()
        # beat within the registry's TTL of the last: the others have counted this
        # replica all along (a stay that began anew is the store's registry lost)
        continuous = self.beaten is not None and clock - self.beaten <= ttl
        self.beaten, self.registry_ttl = clock, ttl
        self._local.remainders.hear(beat.now)
        self._local.heard()
        generation, complete = beat.generation, beat.complete
        if went_back:
            log.warning(
                "limits_store_went_back",
                generation=generation,
                hint="the store restarted with state from before (a snapshot or a failover): "
                "its budgets are rebuilt from every replica's journal",
            )
            generation, complete = None, False
        if self._count(beat.count, beat.stayed >= ttl, continuous) and self._kept is not None:
            # a file written and replaced: off the event loop (its failure logged there)
            await asyncio.to_thread(self._kept.write, self._local.replicas)
        contribution = self._contribution
        stale = generation is None or generation != contribution.generation
        if stale or not beat.contributed or contribution.dirty or not complete:
            complete = await contribution.contribute()
        if complete:
            contribution.told(True)  # the others' parts came in after this replica's
            await self._read_left()
        if self._metrics is not None:
            self._metrics.store_replicas.set(self._local.replicas if self.counted else 0)
            self._metrics.store_remainders.set(len(self._local.remainders.left))
        return beat.count

    async def _read_left(self) -> None:
        """Read what is left of every budget this replica watches (one round trip, apart
        from the heartbeat's, so that a long read never makes the replica look gone),
        when every admission it made without the store is in the store (contributed)."""
        remainders, contribution = self._local.remainders, self._contribution
        if contribution.dirty or contribution.syncing:
            return
        seq = remainders.seq
        watched = self._shared.book.watched(time.time())
        try:
            async with asyncio.timeout(max(self._calls.timeout, 1.0)):
                now, consumed = await self._shared.read_budgets(watched)
        except STORE_ERRORS as exc:  # the remainders kept stay: older, never wrong
            log.warning("limits_remainders_unread", error=type(exc).__name__)
            return
        remainders.read(now, seq, watched, consumed)

    async def renew(self) -> int | None:
        """Extend the store's holds of this replica's requests still in flight (one round
        trip for all); the holds extended (None: the store did not answer)."""
        try:
            async with asyncio.timeout(max(self._calls.timeout, 1.0)):
                renewed, asked = await self._shared.renew()
        except STORE_ERRORS as exc:
            self._calls.failed("renew", exc)
            return None
        if renewed < asked:  # expired before this renewal (the store was away a TTL)
            log.warning("limits_holds_lost", asked=asked, renewed=renewed)
        return renewed

    def _count(self, live: int, settled: bool, continuous: bool) -> bool:
        """Divide by the configured count, else by the live one once this replica has
        stayed a registry TTL in the store (every replica that stayed as long is in it;
        one that joined later has not stayed as long, and refuses); before that the count
        is not known, but for a replica that was counted and has beaten all along (its
        stay began anew because the store lost its registry, restarted empty) or that
        recalls the count it read before it restarted: that count still divides (by no
        fewer than the live one) until its new stay is a TTL long. Whether the count was
        read (to keep it)."""
        local = self._local
        if self.configured:
            local.set_replicas(self.configured)
        elif settled:
            self.counted, self.recalled = True, 0
            local.set_replicas(live)
        else:
            self.counted = self.counted and (continuous or self.recalled > 0)
            local.set_replicas(max(local.replicas, live))
        self._expect()
        return settled and not self.configured

    def counted_now(self) -> bool:
        """Whether this replica knows how many divide: the count is declared, or read by
        its last heartbeat, which was no longer than the registry's TTL before the store
        stopped answering (a replica whose heartbeat was late longer than that may be
        missing from the others' counts, which then divide by fewer)."""
        if self.configured:
            return True
        since, beaten = self._calls.failing_since, self.beaten
        late = since is not None and beaten is not None and since - beaten > self.registry_ttl
        return self.counted and not late

    def problem(self) -> tuple[str, bool] | None:
        """What /readyz reports about the store, and whether it fails readiness: when
        this replica refuses every limited request of the default fail mode while one
        that reaches the store (or can divide) would serve them. Unreachable: the last
        heartbeat failed or the breaker is open (one slow request is neither)."""
        mode = self._local.fail_mode
        local = mode is FailMode.LOCAL
        if not self.beating or self._calls.breaker.open:
            if mode is FailMode.CLOSED:
                return "unreachable: limited tenants refused (fail mode closed)", True
            if local and not self.counted_now():
                return f"unreachable: limited tenants refused: {UNCOUNTED}", True
            if local:
                return (
                    "unreachable: limited tenants admitted by this replica's share of "
                    f"what the store last said was left of each limit "
                    f"(1/{self._local.replicas}; a budget with no such remainder is refused)",
                    False,
                )
            return "unreachable: limited tenants admitted without limits (fail mode open)", False
        contribution = self._contribution
        if contribution.generation is not None and not contribution.complete:
            return "rebuilding: the store was found empty; waiting for every replica's part", False
        if local and not self.counted:
            return f"counting replicas: were the store to fail now, {UNCOUNTED}", False
        return None
