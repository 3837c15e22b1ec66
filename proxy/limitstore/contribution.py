"""This replica's contribution to the store: its part of every budget, as its total, sent
once its journal is read, whenever it billed or admitted without the store, and when the
store answers again; a store found empty starts a generation (a rebuild, logged and
counted) that is whole once every replica has contributed."""

from __future__ import annotations

import asyncio
import contextlib
import time

import structlog

from proxy.limitstore.calls import StoreCalls
from proxy.limitstore.client import STORE_ERRORS
from proxy.limitstore.redislimiter import RedisLimiter
from proxy.metrics import Metrics

log = structlog.get_logger("proxy.limitstore.contribution")


class Contribution:
    """When and how this replica contributes its part to the store, and what the store
    said of its budgets' generation."""

    def __init__(self, shared: RedisLimiter, calls: StoreCalls, metrics: Metrics | None) -> None:
        self._shared = shared
        self._calls = calls
        self.known = 0  # the replicas the operator declared, whom a new generation waits for
        self.seen = 0  # those this replica counted: a new generation need not wait its grace
        self._metrics = metrics
        self.restored = False  # this replica's journal read: it can contribute
        self.dirty = False  # billed without the store: to contribute
        self.rebuilds = 0  # generations this replica started (the store was found empty)
        self.generation: str | None = None  # the last one this replica contributed to
        self.complete = False  # whether the store's budgets were whole when last told
        self._syncing: asyncio.Task[bool] | None = None

    def expect(self, declared: int, seen: int) -> None:
        """The replicas a generation new to the store waits for: those declared
        (``--limits-replicas``; 0: none), or as many as this replica counted (0: none
        known: the generation's grace)."""
        self.known, self.seen = declared, seen

    def owe(self) -> None:
        """This replica billed or admitted without the store: to contribute."""
        self.dirty = True

    def readied(self) -> None:
        """This replica's journal is read (or it has none): it may contribute."""
        self.restored = True

    def told(self, complete: bool) -> None:
        """The store said whether its budgets are whole."""
        self.complete = complete

    @property
    def syncing(self) -> bool:
        return self._syncing is not None and not self._syncing.done()

    def soon(self) -> None:
        """Contribute in the background, unless a contribution is under way."""
        if self.restored and not self.syncing:
            self._syncing = asyncio.get_running_loop().create_task(self._sync(time.time()))

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
                synced = await self._calls.call(
                    "sync", self._shared.sync(self.known, now, seen=self.seen)
                )
            except STORE_ERRORS as exc:
                self._calls.failed("sync", exc)
                self.dirty = True
                return False
            self._calls.succeeded()
            self._synced(synced.generation, synced.created, synced.budgets)
            complete = self.complete = synced.complete
            if not self.dirty:
                break
            now = time.time()
        return complete

    def _synced(self, generation: str, created: bool, budgets: int) -> None:
        if created:
            self.rebuilds += 1
            if self._metrics is not None:
                self._metrics.store_rebuilds.inc()
            log.warning(
                "limits_store_rebuild",
                generation=generation,
                budgets=budgets,
                expect=self.known or self.seen or "every replica alive after the grace",
            )
        if generation != self.generation:
            self.generation = generation
            log.info("limits_store_contributed", generation=generation, budgets=budgets)

    async def close(self) -> None:
        if self._syncing is not None:
            self._syncing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._syncing
