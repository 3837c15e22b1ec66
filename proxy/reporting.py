"""``usage-proxy report``'s choices, each said on the report: where its records come from
(the ledger ``serve`` exports to, when a DSN is configured, else the local journal: one
replica's records, pruned after ``--journal-retention``), the zone its dates are read in
(``--timezone``, else the limits file's, else the price file's, else UTC), and each budget
in the period holding the report's end and in the one it is in now."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit
from zoneinfo import ZoneInfo

from proxy.accounting.price_schedule import PriceFile
from proxy.accounting.prices import PriceTable
from proxy.accounting.zones import zone_named
from proxy.ledger.journal_files import list_exporters, read_journal
from proxy.ledger.records import UsageRecord
from proxy.ledger.report import BudgetRow
from proxy.ledger.shards import shards
from proxy.limits.budgets import BudgetUse, budget_use
from proxy.limits.costs import billed
from proxy.limits.limiter import Cost, Usage, Who
from proxy.limits.periods import earliest_start
from proxy.limits.policy import Policies
from proxy.settings import Sources

TIME_HELP = (
    "ISO 8601 date or time; one without a zone is read in the report's zone (--timezone, "
    "else the limits file's, else the price file's, else UTC); or today, yesterday, 7d, 12h"
)
END, NOW = "report end", "now"


@dataclass(frozen=True, slots=True)
class Source:
    """Where the report reads its records."""

    dsn: str | None  # the PostgreSQL ledger, or None: the journal
    journal: Path
    retention_hours: float

    @property
    def ledger(self) -> bool:
        return self.dsn is not None

    def read(self, since: str | None, until: str | None) -> list[UsageRecord]:
        """Records in ``[since, until)`` (ISO 8601 in UTC)."""
        if self.dsn is not None:
            from proxy.ledger.sinks.postgres import read_ledger  # asyncpg only when asked

            return asyncio.run(read_ledger(self.dsn, since, until))
        return [UsageRecord.from_json(b) for b in read_journal(self.journal, since, until)]

    def describe(self) -> str:
        """The source in one sentence, with what it holds and what it may lack."""
        if self.dsn is not None:
            return f"PostgreSQL ledger {redacted(self.dsn)} (every replica's records)"
        workers = sum(1 for path in shards(self.journal) if path != self.journal)
        what = (
            f"local journal {self.journal} and its {workers} worker shard(s) (this pod's "
            "records only"
            if workers > 0
            else f"local journal {self.journal} (this replica's records only"
        )
        if self.pruned_after() is None:
            return what + ", none pruned: it has no exporter)"
        return (
            what + f"; records every exporter has are pruned after {self.retention_hours:g} h, "
            "--journal-retention: for older ranges read the ledger, --ledger-dsn)"
        )

    def pruned_after(self) -> float | None:
        """Hours after which the journal drops delivered records; None when it keeps all
        (no exporter, or retention 0)."""
        if self.dsn is not None or not self.retention_hours:
            return None
        return self.retention_hours if list_exporters(self.journal) else None

    def gap(self, since: str | None, now: datetime) -> str | None:
        """A warning when the range starts before what the journal still holds."""
        hours = self.pruned_after()
        if hours is None:
            return None
        kept = now - timedelta(hours=hours)
        if since is not None and datetime.fromisoformat(since) >= kept:
            return None
        return (
            f"the range starts before {kept.isoformat(timespec='minutes')}: the journal "
            f"{self.journal} has pruned delivered records older than {hours:g} h, so this "
            "report may miss some; the ledger (--ledger-dsn or USAGE_PROXY_LEDGER_DSN) has them"
        )


def choose_source(journal: Path | None, dsn: str | None, options: Sources) -> Source:
    """A flag decides; else the ledger when one is configured (environment or config
    file, as ``serve`` exports to it), else the journal ``serve`` writes."""
    retention = options.journal_retention
    if journal is not None:
        return Source(None, journal, retention)
    return Source(dsn or options.ledger_dsn, Path(options.journal), retention)


def redacted(dsn: str) -> str:
    """A DSN without its password, to print."""
    if "://" not in dsn:
        return re.sub(r"password\s*=\s*\S+", "password=***", dsn)
    parts = urlsplit(dsn)
    if parts.password is None:
        return dsn
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def report_zone(
    name: str | None, policies: Policies | None, prices: PriceFile | None = None
) -> tuple[ZoneInfo, str]:
    """The zone the report reads dates and groups days in, and why that one:
    ``--timezone``, else the limits file's, else the price file's, else UTC."""
    if name:
        try:
            return zone_named(name), "--timezone"
        except ValueError as exc:
            raise ValueError(f"--timezone {exc}") from None
    if policies is not None:
        return policies.zone, "the limits file's timezone"
    if prices is not None:
        return ZoneInfo(prices.timezone), "the price file's timezone"
    return ZoneInfo("UTC"), "the default"


def instant(value: str | None, zone: ZoneInfo, now: datetime | None = None) -> str | None:
    """A user-given time as the instant it names, in the journal's form: ISO 8601 in UTC.
    A time without an offset, and ``today``/``yesterday`` (midnight), are read in ``zone``.
    The journal compares its UTC times as text, so a bound with another offset must be
    converted, not kept as written."""
    if not value:
        return None
    now = (now or datetime.now(UTC)).astimezone(zone)
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    word = value.strip().lower()
    relative = {"now": now, "today": midnight, "yesterday": midnight - timedelta(days=1)}
    if word in relative:
        return _utc(relative[word])
    if word[:-1].isdigit() and word[-1:] in ("d", "h"):
        unit = timedelta(days=1) if word.endswith("d") else timedelta(hours=1)
        return _utc(now - int(word[:-1]) * unit)
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"cannot read the time {value!r}: use {TIME_HELP}") from None
    return _utc(moment if moment.tzinfo else moment.replace(tzinfo=zone))


def _utc(moment: datetime) -> str:
    """UTC, as the journal stores times (a zone's offset is worked out for the wall-clock
    time: ``midnight - 1 day`` is yesterday's local midnight across a DST change too)."""
    return moment.astimezone(UTC).isoformat()


def shown(moment: str | None, zone: ZoneInfo) -> str | None:
    """An instant as the report shows it: in its zone, with the offset."""
    return datetime.fromisoformat(moment).astimezone(zone).isoformat() if moment else None


def budget_rows(
    policies: Policies,
    read: Callable[[str, str | None], list[UsageRecord]],
    until: str | None,
    now: datetime,
    table: PriceTable | None = None,
) -> tuple[BudgetRow, ...]:
    """Each budget in its period holding the report's end (just before ``until``, else
    now) and, when that is another, in the period it is in now: what the month-end
    invoice says and what admission enforces today; a money budget's as admission bills
    it, at ``table``'s prices. ``read(since, until)`` gives the records of a range."""
    end = datetime.fromisoformat(until).timestamp() if until else now.timestamp()
    moments = {END: (end - 0.001, until), NOW: (now.timestamp(), None)}  # until: exclusive
    found: dict[tuple[tuple[str, ...], str, float], tuple[BudgetUse, list[str]]] = {}
    for label, (at, upper) in moments.items():
        start = datetime.fromtimestamp(earliest_start(at, policies.zone), UTC).isoformat()
        history = [_usage(r, table) for r in read(start, upper)]
        for use in budget_use(policies, history, at):
            found.setdefault((use.scope, use.budget, use.start), (use, []))[1].append(label)
    ordered = sorted(found.values(), key=lambda item: (_order(item[0]), item[0].start))
    currency = table.currency if table else None
    return tuple(_row(use, tuple(labels), policies.zone, currency) for use, labels in ordered)


def _usage(r: UsageRecord, table: PriceTable | None) -> Usage:
    money = billed(table, r.model, r.units.quantities(), r.time, 0)[0] if table else 0
    cost = Cost(r.prompt_tokens_billed or 0, r.completion_tokens_billed or 0, money=money)
    return Usage(Who(r.tenant, r.model, r.key_hash), r.time.timestamp(), cost)


def _order(use: BudgetUse) -> tuple[str, int, tuple[str, ...], str]:
    kinds = ("tenant", "model", "key")
    return use.scope[1], kinds.index(use.scope[0]), use.scope[2:], use.budget


def _row(use: BudgetUse, holds: tuple[str, ...], zone: ZoneInfo, currency: str | None) -> BudgetRow:
    def local(moment: float) -> str:
        return datetime.fromtimestamp(moment, zone).isoformat(timespec="minutes")

    scope = use.scope
    label = scope[1] if len(scope) == 2 else f"{scope[1]} / {scope[0]} {scope[2]}"
    money = currency if use.budget.startswith("cost_") else None
    return BudgetRow(
        label,
        use.budget,
        local(use.start),
        local(use.end),
        use.used,
        use.amount,
        currency=money,
        holds=holds,
    )
