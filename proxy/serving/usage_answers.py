"""The figures the usage and admin APIs answer, from the code that decides and bills: a
tenant's standing from the limiter admission asks (``Limiter.standing``), a range's usage
aggregated and priced by the report's code (``ledger.report``, ``ledger.charges``), and a
record as it was journaled. Records are read in a worker thread (``RecordSource``), and
aggregated there too: nothing that scales with them runs on the event loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar
from zoneinfo import ZoneInfo

from proxy.accounting.money import plain
from proxy.accounting.prices import PriceTable
from proxy.accounting.units import Unit
from proxy.ledger.charges import charge
from proxy.ledger.lookup import RecordSource
from proxy.ledger.records import UsageRecord
from proxy.ledger.report import aggregate, row_key
from proxy.limits.limiter import Limiter
from proxy.limits.periods import period
from proxy.limits.policy import Window
from proxy.limits.standings import standing_json
from proxy.serving.admission import Admission
from proxy.serving.pricesfile import Prices
from proxy.settings import Settings

GROUP = ("model", "operation")
# Questions read records in at most this many worker threads at once: the default
# executor also parses large request bodies, which no question may starve.
READS = 2
T = TypeVar("T")


class BadRange(ValueError):
    """A ``since`` or ``until`` that is not an ISO 8601 time."""


@dataclass(frozen=True, slots=True)
class Figures:
    """What the answers are read from: the limiter (None without ``--limits``), the price
    table in use (None without ``--prices``) and the records' source."""

    limiter: Callable[[], Limiter | None]
    table: Callable[[], PriceTable | None]
    source: RecordSource
    reads: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(READS))

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a worker thread, at most ``READS`` at once."""
        async with self.reads:
            return await asyncio.to_thread(fn, *args)

    @property
    def zone(self) -> ZoneInfo:
        """The limits file's zone (else UTC): the zone a default range is a month of."""
        limiter = self.limiter()
        return limiter.policies.zone if limiter is not None else ZoneInfo("UTC")

    async def standing(self, tenant: str) -> dict[str, object]:
        """Every limit of ``tenant`` in its current period or window, as the limiter
        would decide now (``StandingUnknown`` when it cannot say)."""
        now = time.time()
        limiter, table = self.limiter(), self.table()
        readings = await limiter.standing(tenant, now) if limiter is not None else []
        currency = table.currency if table is not None else None
        return {
            "tenant": tenant,
            "at": _iso(now),
            "limited": limiter is not None,
            "read_from": "limits store"
            if limiter is not None and limiter.shared_store
            else "this replica",
            "limits": [standing_json(r, currency, now) for r in readings],
        }

    def bounds(self, since: str | None, until: str | None) -> tuple[str, str]:
        """The range asked for, as UTC instants; by default the current month in the
        limits file's zone."""
        now = time.time()
        start, end = period(Window.MONTH, now, self.zone)
        low = _instant(since, self.zone) if since else _iso(start)
        high = _instant(until, self.zone) if until else _iso(end)
        return low, high

    async def usage(self, tenant: str, since: str, until: str) -> dict[str, object]:
        """``tenant``'s billed units per model and operation in ``[since, until)``, and
        their amounts at the prices in force at each record's time."""
        table = self.table()
        return await self.off_loop(self._usage, tenant, since, until, table)

    def _usage(
        self, tenant: str, since: str, until: str, table: PriceTable | None
    ) -> dict[str, object]:
        records = self.source.page(since, until, tenant)
        report = aggregate(records, group_by=GROUP)
        charges = charge(records, table, lambda r: row_key(r, GROUP)) if table else None
        rows = []
        for row in report.rows:
            line: dict[str, object] = {
                **row.keys,
                "requests": row.requests,
                Unit.PROMPT.value: row.prompt_tokens_billed,
                Unit.CACHED.value: row.cached_prompt_tokens_billed,
                Unit.COMPLETION.value: row.completion_tokens_billed,
                Unit.AUDIO.value: row.audio_seconds_billed,
            }
            if charges is not None:
                amounts = charges.rows.get(tuple(row.keys[g] for g in GROUP))
                line["amount"] = plain(amounts.total) if amounts else "0"
                line["unpriced_requests"] = amounts.unpriced if amounts else 0
            rows.append(line)
        body: dict[str, object] = {
            "tenant": tenant,
            "since": since,
            "until": until,
            **self.source.describe(),
            "rows": rows,
        }
        if charges is not None and table is not None:
            mine = charges.tenant(tenant)
            body["currency"] = table.currency
            body["amount"] = plain(mine.amount) if mine else "0"
            body["due"] = str(mine.due if mine else Decimal(0).scaleb(-table.decimals))
        return body

    async def record(self, tenant: str | None, record_id: str) -> dict[str, object] | None:
        """A record by id; None when there is none, or it is another tenant's (the
        same answer: nothing leaks by existence)."""
        table = self.table()
        return await self.off_loop(self._record, tenant, record_id, table)

    def _record(
        self, tenant: str | None, record_id: str, table: PriceTable | None
    ) -> dict[str, object] | None:
        record = self.source.record(record_id)
        if record is None or (tenant is not None and record.tenant != tenant):
            return None
        return {**self.source.describe(), "record": record_json(record, table)}


def build_figures(
    settings: Settings, admission: Admission | None, prices: Prices | None
) -> Figures:
    """What the answers read: admission's limiter, the prices in use, and the ledger
    (``--ledger-dsn``) or else the journal."""
    journal = Path(settings.journal) if settings.metering else None
    return Figures(
        lambda: admission.limiter if admission is not None else None,
        lambda: prices.table if prices is not None else None,
        RecordSource(settings.ledger_dsn, journal),
    )


def record_json(record: UsageRecord, table: PriceTable | None) -> dict[str, object]:
    """A record as answered: its verdict, what the engine reported against what is
    billed, its units, and with a price table its amount (the report's pricing)."""
    body: dict[str, object] = {
        "record_id": record.record_id,
        "time": record.time.isoformat(),
        "tenant": record.tenant,
        "model": record.model,
        "operation": record.operation,
        "endpoint": record.endpoint,
        "status": record.status,
        "verdict": record.verdict,
        "reported": {
            "prompt_tokens": record.prompt_tokens_reported,
            "completion_tokens": record.completion_tokens_reported,
        },
        "billed": {
            "prompt_tokens": record.prompt_tokens_billed,
            "completion_tokens": record.completion_tokens_billed,
        },
        "units": record.units.reported(),
    }
    if table is not None:
        priced = charge([record], table, lambda r: ())
        mine = priced.tenant(record.tenant)
        body["currency"] = table.currency
        body["amount"] = plain(mine.amount) if mine and not mine.unpriced else None
    return body


def _instant(value: str, zone: ZoneInfo) -> str:
    """An ISO 8601 time as the UTC instant it names (one without an offset is read in
    ``zone``)."""
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise BadRange(f"cannot read the time {value!r}: use ISO 8601") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=zone)).astimezone(UTC).isoformat()


def _iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).isoformat()
