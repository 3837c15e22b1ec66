"""This replica's contribution to the store: its part of every budget, as its total, sent
once its journal is read, whenever it billed or admitted without the store, and when the
store answers again; a store found empty starts a generation (a rebuild, logged and
counted) that is whole once every replica has contributed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

import structlog

from proxy.limits.limiter import Usage
from proxy.limitstore.breaker import STORE_ERRORS
from proxy.limitstore.replay import Replay

log = structlog.get_logger("proxy.limitstore.contribution")


class Contribution(Replay):
    """When and how this replica contributes its part to the store."""

    def _back(self) -> None:
        self._stale = True
        if self._succeeded() or self.dirty:
            log.info("limits_store_back", dirty=self.dirty, missed=len(self.missed))
            self._contribute_soon()
        if self.missed and (self._replaying is None or self._replaying.done()):
            self._replaying = asyncio.get_running_loop().create_task(self._replay(None))

    def _contribute_soon(self) -> None:
        if self.restored and (self._syncing is None or self._syncing.done()):
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
