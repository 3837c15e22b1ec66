"""Shard adoption on scale-down (docs/workers.md, "A shard per worker"): a pod that ran
with more workers before left shards no worker of its own writes. Each still holds
records that may be undelivered; worker ``k mod N`` delivers them, with a journal that
never appends and its own outbox (exports, dead letters, prune), as the shard's own worker
would have."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import structlog
from aiohttp import web

from proxy.ledger.exporters import build_sinks
from proxy.ledger.journal import Journal
from proxy.ledger.outbox import Outbox
from proxy.ledger.sinks import Sink
from proxy.metrics import Metrics
from proxy.serving.startup import journal_problem
from proxy.settings import Durability, Settings

log = structlog.get_logger("proxy.serving.adoption")

Context = Callable[[web.Application], AsyncIterator[None]]


def adopted_outbox(
    settings: Settings, shard: Path, sinks: list[Sink] | None, metrics: Metrics
) -> Outbox:
    """An outbox over an adopted shard, with sinks of its own (an outbox closes its sinks
    when it drains). Its backlog and dead letters are added to the worker's own shard's
    in the gauges (``Metrics.export_levels``); its deliveries are counted as its own."""
    journal = Journal(
        shard,
        sync=settings.durability is Durability.SYNC,
        commit_timeout=settings.journal_commit_timeout,
        commit_interval=settings.commit_interval,
    )
    exporters = build_sinks(settings) if sinks is None else sinks
    return Outbox(journal, exporters, retention=settings.journal_retention * 3600, metrics=metrics)


def adoption_context(
    settings: Settings, shards: Sequence[Path], sinks: list[Sink] | None, metrics: Metrics
) -> Context:
    """cleanup_ctx: deliver every adopted shard while the worker serves; drain them on
    shutdown as the worker's own."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        outboxes = [adopted_outbox(settings, shard, sinks, metrics) for shard in shards]
        for outbox in outboxes:
            try:
                await outbox.journal.open()
            except (OSError, sqlite3.Error) as exc:
                raise journal_problem(exc, str(outbox.journal.path)) from exc
            await outbox.start()
            log.info("shard_adopted", shard=str(outbox.journal.path))
        yield
        # Together, under one --drain-timeout: the supervisor's patience counts one.
        await asyncio.gather(*(_drain(outbox, settings.drain_timeout) for outbox in outboxes))

    return ctx


async def _drain(outbox: Outbox, timeout: float) -> None:
    await outbox.drain(timeout)
    await outbox.journal.close()
