"""Delivery from the journal to every sink: at least once, in order, with capped backoff.

Each sink has its own task and cursor in the journal. A transient failure only delays
that sink; it never touches client traffic. A permanent rejection never blocks it: the
batch is split until the rejected records are isolated, they go to the dead-letter store
(``usage-proxy dead-letters``), everything else is delivered. On shutdown the outbox
drains for a bounded time and leaves anything undelivered in the journal.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import structlog

from proxy.ledger.journal import Journal
from proxy.ledger.sinks import PermanentDeliveryError, RetryLater, Sink
from proxy.ledger.windows import Entry
from proxy.metrics import Metrics

log = structlog.get_logger("proxy.ledger.outbox")
MAX_RETRY_AFTER = 300.0


@dataclass
class SinkState:
    failures: int = 0
    last_error: str | None = None
    backoff: float = 0.0


class Outbox:
    def __init__(
        self,
        journal: Journal,
        sinks: Sequence[Sink],
        *,
        batch_size: int = 500,
        min_backoff: float = 0.2,
        max_backoff: float = 30.0,
        poll_interval: float = 1.0,
        metrics: Metrics | None = None,
        retention: float = 0.0,
        prune_interval: float = 60.0,
    ) -> None:
        self.journal = journal
        self.sinks = list(sinks)
        self.state = {s.name: SinkState() for s in self.sinks}
        self._batch_size = batch_size
        self._min_backoff = min_backoff
        self._max_backoff = max_backoff
        self._poll = poll_interval
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._metrics = metrics
        self._retention = retention
        self._pruner: asyncio.Task[None] | None = None
        self._prune_interval = prune_interval

    async def start(self) -> None:
        names = [s.name for s in self.sinks]
        await self.journal.register(names)
        for name, backlog in (await self.journal.exporters()).items():
            if name not in names:
                log.warning(
                    "exporter_not_configured",
                    sink=name,
                    undelivered=backlog,
                    kept="its records stay in the journal until it is configured again "
                    f"or discarded (usage-proxy exporters discard {name})",
                )
        for sink in self.sinks:
            await sink.start()
            self._tasks.append(asyncio.create_task(self._run(sink), name=f"outbox-{sink.name}"))
        if self._retention > 0 and self.sinks:
            self._pruner = asyncio.create_task(self._prune_loop(), name="journal-prune")

    async def _prune_loop(self) -> None:
        """Drop delivered records older than the retention, every prune interval."""
        while not self._stopping:
            before = datetime.now(UTC) - timedelta(seconds=self._retention)
            try:
                removed = await self.journal.prune(before.isoformat())
            except Exception as exc:  # pruning is housekeeping; never fatal
                log.warning("journal_prune_failed", error=str(exc))
            else:
                if removed:
                    log.debug("journal_pruned", records=removed)
            await asyncio.sleep(self._prune_interval)

    async def _run(self, sink: Sink) -> None:
        state = self.state[sink.name]
        while True:
            sent = await self._attempt(sink, state)
            if sent == 0 and state.backoff == 0:
                sent = await self._replay(sink, state)
            if self._metrics:
                backlog = await self.journal.backlog(sink.name)
                dead = await self.journal.dead_count(sink.name)
                self._metrics.export_levels(str(self.journal.path), sink.name, backlog, dead)
            if sent == 0 and state.backoff == 0:
                if self._stopping:
                    return
                self.journal.committed.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._poll):
                        await self.journal.committed.wait()
            elif state.backoff:
                await asyncio.sleep(state.backoff)

    async def _attempt(self, sink: Sink, state: SinkState) -> int:
        """Deliver one batch; returns how many records went out (0 when none or failed)."""
        batch = await self.journal.batch(sink.name, self._batch_size)
        if not batch:
            return 0
        try:
            await self._deliver(sink, batch)
        except Exception as exc:  # any sink failure is retried, never raised to clients
            self._failed(sink, state, exc, len(batch))
            return 0
        state.backoff = 0.0
        return len(batch)

    async def _deliver(self, sink: Sink, batch: list[tuple[int, Entry]]) -> None:
        """Deliver ``batch`` and advance the cursor; isolate permanent rejections by halving.

        Transient errors propagate (the cursor stays after the last delivered part).
        """
        try:
            await sink.deliver([record for _, record in batch])
        except PermanentDeliveryError as exc:
            if len(batch) > 1:
                middle = len(batch) // 2
                await self._deliver(sink, batch[:middle])
                await self._deliver(sink, batch[middle:])
                return
            seq, record = batch[0]
            await self.journal.dead_letter(sink.name, record, str(exc))
            await self.journal.ack(sink.name, seq)
            log.error(
                "export_dead_letter",
                sink=sink.name,
                record_id=record.record_id,
                tenant=record.tenant,
                error=str(exc),
            )
            return
        await self.journal.ack(sink.name, batch[-1][0])
        if self._metrics:
            self._metrics.exported.labels(sink.name).inc(len(batch))

    async def _replay(self, sink: Sink, state: SinkState) -> int:
        """Deliver dead letters an operator requeued; rejected again, they stay dead."""
        records = await self.journal.requeued(sink.name, self._batch_size)
        delivered: list[str] = []
        for record in records:
            try:
                await sink.deliver([record])
            except PermanentDeliveryError as exc:
                await self.journal.dead_letter(sink.name, record, str(exc))
            except Exception as exc:
                self._failed(sink, state, exc, 1)
                break
            else:
                delivered.append(record.record_id)
        if delivered:
            await self.journal.revive(sink.name, delivered)
            log.info("export_dead_letters_replayed", sink=sink.name, records=len(delivered))
            if self._metrics:
                self._metrics.exported.labels(sink.name).inc(len(delivered))
        return len(delivered)

    def _failed(self, sink: Sink, state: SinkState, exc: Exception, records: int) -> None:
        state.failures += 1
        if self._metrics:
            self._metrics.export_failures.labels(sink.name).inc()
        state.last_error = f"{type(exc).__name__}: {exc}"
        state.backoff = _next_backoff(state.backoff, self._min_backoff, self._max_backoff)
        if isinstance(exc, RetryLater):  # the receiver said when; within a sane cap
            state.backoff = min(max(exc.retry_after, self._min_backoff), MAX_RETRY_AFTER)
        log.warning(
            "export_failed",
            sink=sink.name,
            error=state.last_error,
            retry_in=round(state.backoff, 2),
            records=records,
        )

    async def drain(self, timeout: float) -> dict[str, int]:
        """Stop after delivering what is journaled, within ``timeout``; returns backlogs."""
        self._stopping = True
        if self._pruner is not None:  # housekeeping: never worth waiting for
            self._pruner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pruner
        self.journal.committed.set()
        deadline = time.monotonic() + timeout
        for task in self._tasks:
            remaining = max(deadline - time.monotonic(), 0)
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                async with asyncio.timeout(remaining):
                    await asyncio.shield(task)
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        backlog = {s.name: await self.journal.backlog(s.name) for s in self.sinks}
        for sink in self.sinks:
            await sink.close()
        if any(backlog.values()):
            log.warning("drain_incomplete", backlog=backlog)
        return backlog


def _next_backoff(current: float, low: float, high: float) -> float:
    """Capped exponential backoff with equal jitter (a wait between half the doubled one
    and all of it), never below the floor: the first wait is ``low`` itself."""
    base = min(high, max(low, current * 2))
    floor = max(low, base / 2)
    return floor + random.random() * (base - floor)
