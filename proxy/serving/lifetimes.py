"""The lifetimes of the ledger's resources in the application (``cleanup_ctx``): the
journal opened before the first request and closed after the last, the exporters
started and drained, the reconciler's task. The objects themselves are built, in order,
by ``create_app``."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import structlog
from aiohttp import web

from proxy.ledger.journal import Journal
from proxy.ledger.outbox import Outbox
from proxy.ledger.reconciler import CountersUnavailable, Reconciler
from proxy.serving.exchange import Exchanges
from proxy.serving.startup import journal_problem
from proxy.serving.upstream import UpstreamError, translated
from proxy.settings import Settings

log = structlog.get_logger("proxy.serving.lifetimes")
Context = Callable[[web.Application], AsyncIterator[None]]


def ledger_context(
    settings: Settings,
    journal: Journal | None,
    outbox: Outbox | None,
    exchanges: Exchanges,
) -> Context:
    """Open the journal and start the exporters; on shutdown let the exchanges in flight
    record, drain the exporters, then close the journal."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        if journal is None or outbox is None:
            yield
            return
        try:
            await journal.open()
        except (OSError, sqlite3.Error) as exc:
            raise journal_problem(exc, settings.journal) from exc
        await outbox.start()
        log.info(
            "metering",
            journal=settings.journal,
            durability=settings.durability.value,
            sinks=[s.name for s in outbox.sinks],
        )
        yield
        await exchanges.finish(settings.drain_timeout)
        await outbox.drain(settings.drain_timeout)
        await journal.close()

    return ctx


def counters_reader(
    session: Callable[[], aiohttp.ClientSession], url: str
) -> Callable[[], Awaitable[str]]:
    """A function that reads the upstream's Prometheus text at ``url`` with the session
    that ``session()`` gives once the application runs."""

    async def read() -> str:
        try:
            with translated(url):
                async with session().get(url, allow_redirects=False) as response:
                    response.raise_for_status()
                    return await response.text()
        except UpstreamError as exc:
            raise CountersUnavailable(exc.message) from exc

    return read


def reconciler_context(settings: Settings, reconciler: Reconciler) -> Context:
    """The reconciler's task (none when --reconcile-interval is 0)."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        if settings.reconcile_interval <= 0:
            yield
            return
        task = asyncio.create_task(reconciler.run(), name="reconcile")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    return ctx
