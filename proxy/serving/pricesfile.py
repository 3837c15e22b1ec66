"""The ``--prices`` table in use (``Prices``, which also prices each record as it is
recorded, for the spend metrics: the report re-prices the journal exactly, the metric is
for dashboards) and its file, reloaded as the limits file is: on ``SIGHUP`` and when it
changes (polled). A new table is validated whole and checked against the limits in use
(every model a ``cost_per_*`` budget applies to must have a price in force); one that
fails is logged in one line and counted, and the table in use stays.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import structlog
import yaml
from aiohttp import web
from pydantic import ValidationError

from proxy.accounting.price_schedule import load_prices, one_line
from proxy.accounting.prices import PriceTable
from proxy.accounting.units import Quantities
from proxy.ledger.records import UsageRecord
from proxy.metrics import Metrics
from proxy.serving.filewatch import POLL_SECONDS, Context, FileWatch, watch_context

log = structlog.get_logger("proxy.serving.pricesfile")

# Why a table cannot be used with the limits in use (one line), or None.
Check = Callable[[PriceTable], str | None]


def read_table(path: Path) -> PriceTable:
    """A price file's table; ``ValueError`` with the whole story in one line."""
    try:
        return load_prices(path)
    except (OSError, UnicodeDecodeError, yaml.YAMLError, ValidationError, ValueError) as exc:
        raise ValueError(one_line(exc)) from None


class Prices:
    """The price table in use: read by admission and the spend metrics, replaced whole by
    the price file's reload."""

    def __init__(self, table: PriceTable, metrics: Metrics) -> None:
        self.table = table
        self._metrics = metrics

    def account(self, record: UsageRecord) -> None:
        """A recorded record's amount, at its time, into the spend metrics (a Recorder
        subscriber)."""
        q = record.units.quantities()
        if q == Quantities():
            return
        table = self.table
        rate = table.rate(record.model, record.time)
        lines = rate.lines(q) if rate is not None else None
        model = self._metrics.model(record.model or "")
        tenant = self._metrics.tenant(record.tenant)
        if lines is None:
            self._metrics.unpriced.labels(model, *tenant).inc()
            return
        amount = sum((line.amount for line in lines), Decimal(0))
        self._metrics.spend.labels(model, table.currency, *tenant).inc(float(amount))


class PricesFile:
    def __init__(
        self,
        path: Path,
        prices: Prices,
        metrics: Metrics,
        *,
        check: Check = lambda table: None,
        poll: float = POLL_SECONDS,
    ) -> None:
        self.path = path
        self.prices = prices
        self._check = check
        self._metrics = metrics
        self._watch = FileWatch(path, poll)
        self._missing: str | None = None  # the last problem the watch logged
        metrics.prices_loaded_at.set(time.time())

    def reload(self, why: str) -> bool:
        """Load the file now; True when its table is in use."""
        self._watch.loading()
        try:
            table = read_table(self.path)
            problem = self._check(table)
            if problem is not None:
                raise ValueError(problem)
        except ValueError as exc:
            self._metrics.prices_reload_failures.inc()
            log.error("prices_reload_failed", path=str(self.path), why=why, error=str(exc)[:500])
            return False
        self.prices.table = table
        self._metrics.prices_loaded_at.set(time.time())
        log.info(
            "prices_loaded",
            path=str(self.path),
            why=why,
            currency=table.currency,
            models=len(list(table.models())),
            default=bool(table.rates.get(None)),
        )
        return True

    async def watch(self) -> None:
        """Reload on change; and say once when a model served since lacks a price while a
        money budget applies to it (its requests are refused meanwhile)."""
        await self._watch.run(self.reload, self.unpriced)

    def unpriced(self) -> str | None:
        """Why the table in use does not price every model a money budget applies to (a
        model the upstream began serving since), logged once per change; or None."""
        problem = self._check(self.prices.table)
        if problem is not None and problem != self._missing:
            log.warning("prices_missing", path=str(self.path), problem=problem)
        self._missing = problem
        return problem


PRICESFILE = web.AppKey("prices_file", PricesFile)


def prices_file_context(prices: PricesFile) -> Context:
    """cleanup_ctx: the file's watch, for the application's lifetime."""
    return watch_context({"prices-file": prices.watch})
