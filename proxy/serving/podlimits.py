"""A pod's limits across its workers (``serve --workers N``, docs/workers.md, "Limits").

Without ``--limits-store`` the supervisor hosts the pod's limiter (``hosted_limits``):
one in-process limiter rebuilt from every worker's journal shard, a part per shard,
served on ``limiter.sock`` before any worker starts; a worker admits through it (its
limiter connects in its lifetime, before it serves: ``hosted_context``). With a store,
every worker is a replica of its own (``replica_settings``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import structlog
from aiohttp import web

from proxy.accounting.prices import PriceTable
from proxy.ledger.shards import numbered, shard_path
from proxy.limits.history import History
from proxy.limits.limiter import Lifetime, Usage
from proxy.limits.policy import Policies
from proxy.limits.problems import read_limits
from proxy.limitstore.host import LimiterHost, build_host
from proxy.limitstore.hosted import HostError
from proxy.serving.budget_history import history_start, shard_history
from proxy.serving.pod import Place
from proxy.serving.pricesfile import read_table
from proxy.serving.startup import StartupError, file_problem
from proxy.settings import Settings

log = structlog.get_logger("proxy.serving.podlimits")
# How long a dead worker's connection may take to be seen closed by the host (its socket
# closes with the process: at once, unless the supervisor's loop is behind).
HANG_UP_SECONDS = 10.0


@dataclass(slots=True)
class PodLimits:
    """The pod's limiter host, and where it reads each worker's usage again."""

    host: LimiterHost
    journal: Path | None  # None with --journal off: nothing to read again
    prices: Path | None
    table: PriceTable | None  # the price file's table last read

    async def worker_exited(self, index: int) -> int:
        """Worker ``index`` is gone: read its shard again (every record it committed,
        settled with the host or not) as its part, then drop the budget units its lost
        connection still held, so its billing counts exactly once. Call it before the
        worker is started again. The records read.

        In this order: the host first sees the worker's connection closed (its tickets
        then all held), the shard is read in a thread (never on this loop, which answers
        every reservation of the pod), and the part swapped and the held units dropped
        at once, on the loop, between two reservations."""
        if self.journal is None:
            # No shard to read: the held units stay held (never an overshoot), logged.
            log.warning("limits_held_unread", worker=index, why="--journal off")
            return 0
        try:
            async with asyncio.timeout(HANG_UP_SECONDS):
                await self.host.hung_up(index)
        except TimeoutError:  # its tickets, held later, stay held: never an overshoot
            log.warning("limits_hang_up_unseen", worker=index, seconds=HANG_UP_SECONDS)
        path, policies = shard_path(self.journal, index), self.host.limiter.policies
        history, records = await read_part(path, policies, self._table(), time.time())
        self.host.reread(index, history)
        log.info("limits_part_reread", worker=index, records=records)
        return records

    def _table(self) -> PriceTable | None:
        """The price file as it is now (a price added since the start prices the records
        after its cut), else the table last read."""
        if self.prices is not None:
            try:
                self.table = read_table(self.prices)
            except ValueError as exc:
                log.warning("prices_unread", path=str(self.prices), error=str(exc))
        return self.table


@contextlib.asynccontextmanager
async def hosted_limits(settings: Settings, runtime: Path) -> AsyncIterator[PodLimits | None]:
    """The pod's limiter host on ``runtime / "limiter.sock"`` (``Place.limiter_socket``)
    for as long as the supervisor runs, rebuilt from every shard's usage first: a
    restart keeps the month. None without ``--limits``, or with ``--limits-store`` (each
    worker is then a replica of the store). A limits or price file that cannot be read is
    a ``StartupError``."""
    if settings.limits is None or settings.limits_store is not None:
        yield None
        return
    policies = _policies(Path(settings.limits))
    prices = Path(settings.prices) if settings.prices is not None else None
    table = _table(prices) if prices is not None else None
    journal = Path(settings.journal) if settings.metering else None
    host = build_host(policies, runtime / "limiter.sock")
    if journal is not None:
        await restore_shards(host, journal, table)
    await host.start()
    log.info("limiter_host_started", path=str(host.path), parts=sorted(host.limiter.parts))
    try:
        yield PodLimits(host, journal, prices, table)
    finally:
        await host.close()


async def restore_shards(host: LimiterHost, journal: Path, table: PriceTable | None) -> int:
    """Every shard's usage since the earliest period start into the ``host``, one part
    per shard (scaled down ones too), before any worker connects: the records read."""
    now, restored = time.time(), 0
    for index, path in await asyncio.to_thread(numbered, journal):
        history, records = await read_part(path, host.limiter.policies, table, now)
        host.reread(index, history)
        restored += records
    log.info("budgets_restored", journal=str(journal), records=restored)
    return restored


async def read_part(
    path: Path, policies: Policies, table: PriceTable | None, now: float
) -> tuple[History, int]:
    """The shard at ``path`` as a part's usage history, and its records: read and built
    in a thread with its own event loop, so that nothing growing with the month's usage
    runs on the supervisor's."""
    return await asyncio.to_thread(_read_part, path, policies, table, now)


def _read_part(
    path: Path, policies: Policies, table: PriceTable | None, now: float
) -> tuple[History, int]:
    history = History()
    usages = asyncio.run(read_shard(path, policies, table, now))
    for usage in usages:
        history.note(usage.who, usage.cost, usage.at)
    return history, sum(usage.cost.requests for usage in usages)


async def read_shard(
    path: Path, policies: Policies, table: PriceTable | None, now: float
) -> list[Usage]:
    """What the shard at ``path`` billed in the budgets' periods (none if it does not
    exist): the journal's own query, in its own thread, as a worker restores."""
    history, _ = await shard_history(path, history_start(policies, now), table)
    return history


def hosted(settings: Settings, pod: Place | None) -> bool:
    """Whether a worker admits through the pod's limiter host (a pod without a store):
    the host, not the worker, restores its usage."""
    return pod is not None and settings.limits_store is None


def hosted_context(lifetime: Lifetime) -> Lifetime:
    """A hosted limiter's ``lifetime`` (connected before the worker serves), a host that
    cannot be reached then said as a start-up error."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        connected = lifetime(app)
        try:
            await anext(connected)
        except HostError as exc:
            raise StartupError(f"{exc}; the supervisor starts it before any worker") from None
        yield
        with contextlib.suppress(StopAsyncIteration):
            await anext(connected)

    return ctx


def replica_settings(settings: Settings, pod: Place) -> Settings:
    """A pod's worker on ``--limits-store`` is a replica of its own: ``instance#index``
    (stable across its restarts: its part stays its shard's), and ``--limits-replicas``,
    which counts pods, times the pod's workers."""
    return settings.model_copy(
        update={
            "instance": f"{settings.instance}#{pod.index}",
            "limits_replicas": settings.limits_replicas * pod.workers,
        }
    )


def _policies(path: Path) -> Policies:
    try:
        return read_limits(path)
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and LimitsFileError too
        fix = "fix the path, or the file (README: Budgets and rate limits)"
        raise file_problem(exc, "--limits", path, fix) from None


def _table(path: Path) -> PriceTable:
    try:
        return read_table(path)
    except ValueError as exc:
        fix = "fix the path, or the file (docs/metering.md: Prices)"
        raise file_problem(exc, "--prices", path, fix) from None
