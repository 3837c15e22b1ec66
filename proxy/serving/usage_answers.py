"""The figures the usage and admin APIs answer, from the code that decides and bills: a
tenant's standing from the limiter admission asks (``Limiter.standing``), a range's usage
aggregated and priced by the report's code (``ledger.report``, ``ledger.charges``), and a
record as it was journaled. Records are read, aggregated and priced in a reading process
(``usage_reads``): nothing that scales with them runs in the proxy's process."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

from proxy.accounting.prices import PriceTable
from proxy.ledger.lookup import After, RecordSource
from proxy.ledger.questions import Page, read_page, read_record, read_usage, record_json
from proxy.ledger.shards import journal_of
from proxy.limits.limiter import Limiter
from proxy.limits.periods import period
from proxy.limits.policy import Window
from proxy.limits.standings import standing_json
from proxy.serving.admission import Admission
from proxy.serving.pricesfile import Prices
from proxy.serving.usage_reads import Readers
from proxy.settings import Settings

__all__ = ["BadRange", "Figures", "Page", "build_figures", "record_json"]


class BadRange(ValueError):
    """A ``since`` or ``until`` that is not an ISO 8601 time."""


@dataclass(frozen=True, slots=True)
class Figures:
    """What the answers are read from: the limiter (None without ``--limits``), the price
    table in use (None without ``--prices``), the records' source and the processes that
    read it."""

    limiter: Callable[[], Limiter | None]
    table: Callable[[], PriceTable | None]
    source: RecordSource
    readers: Readers = field(default_factory=Readers)

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
        limits file's zone. ``BadRange``: a time that is none, or that no UTC instant
        is, or a range that ends where or before it starts."""
        zone = self.zone
        start, end = period(Window.MONTH, time.time(), zone)
        low = _instant(since, zone) if since else datetime.fromtimestamp(start, UTC)
        high = _instant(until, zone) if until else datetime.fromtimestamp(end, UTC)
        if low >= high:
            raise BadRange(f"the range ends before it starts: since {low} until {high}")
        return low.isoformat(), high.isoformat()

    async def usage(self, tenant: str, since: str, until: str) -> dict[str, object]:
        """``tenant``'s billed units per model and operation in ``[since, until)``, and
        their amounts at the prices in force at each record's time (``ReadFailed``
        when the records cannot be read)."""
        table = self.table()
        return await self.readers.run(read_usage, self.source, tenant, since, until, table)

    async def record(self, tenant: str | None, record_id: str) -> dict[str, object] | None:
        """A record by id; None when there is none, or it is another tenant's (the
        same answer: nothing leaks by existence)."""
        table = self.table()
        return await self.readers.run(read_record, self.source, tenant, record_id, table)

    async def page(
        self, since: str, until: str, tenant: str | None, after: After | None, limit: int
    ) -> Page:
        """A page of the range's records, as JSON lines."""
        return await self.readers.run(read_page, self.source, since, until, tenant, after, limit)


def build_figures(
    settings: Settings, admission: Admission | None, prices: Prices | None, worker: int = 0
) -> Figures:
    """What the answers read: admission's limiter, the prices in use, and the ledger
    (``--ledger-dsn``) or else the journal: in a pod, whose ``worker`` journals to its
    own shard, every shard of the pod's journal."""
    journal = journal_of(Path(settings.journal), worker) if settings.metering else None
    return Figures(
        lambda: admission.limiter if admission is not None else None,
        lambda: prices.table if prices is not None else None,
        RecordSource(settings.ledger_dsn, journal),
    )


def _instant(value: str, zone: ZoneInfo) -> datetime:
    """An ISO 8601 time as the UTC instant it names (one without an offset is read in
    ``zone``)."""
    try:
        moment = datetime.fromisoformat(value)
        return (moment if moment.tzinfo else moment.replace(tzinfo=zone)).astimezone(UTC)
    except ValueError:
        raise BadRange(f"cannot read the time {value!r}: use ISO 8601") from None
    except OverflowError:  # a time whose UTC instant is past year 9999 (or before 1)
        raise BadRange(f"the time {value!r} is out of range once in UTC") from None


def _iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).isoformat()
