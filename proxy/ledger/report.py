"""``usage-proxy report``: usage grouped by tenant, model, operation or day, from the
journal or the ledger, with per-tenant subtotals, totals and the period covered.

Aggregation is pure; ``report_formats`` renders it. Prompt (input) and completion (output)
tokens are kept apart everywhere, because every provider prices them apart.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo

from proxy.accounting.money import from_nanos, plain
from proxy.accounting.units import Unit
from proxy.ledger.charges import Charges
from proxy.ledger.records import UsageRecord

GROUPS = ("tenant", "model", "operation", "day")
# Billed as vLLM reported them, without the proxy's proof.
UNPROVEN = frozenset({"mismatch", "unaudited"})
# Every verdict a record can carry, in the order the columns show them; "none" is a record
# without one (e.g. an error answer).
VERDICTS = ("exact", "corrected", "reported", "mismatch", "unaudited", "invalid", "none")


@dataclass(frozen=True)
class Column:
    name: str
    title: str
    meaning: str
    short: str = ""  # the text table's narrower heading; the title when empty


COLUMNS = (
    Column("requests", "Requests", "metered requests (one usage record each)"),
    Column(
        "prompt_tokens_reported",
        "Prompt reported",
        "input tokens vLLM reported (usage.prompt_tokens)",
        "Prompt rep.",
    ),
    Column(
        "prompt_tokens_billed",
        "Prompt billed",
        "input tokens billed: the engine's count where the proxy proved it, otherwise what "
        "vLLM reported",
        "Prompt billed",
    ),
    Column(
        "completion_tokens_reported",
        "Completion reported",
        "output tokens vLLM reported (usage.completion_tokens)",
        "Compl. rep.",
    ),
    Column(
        "completion_tokens_billed", "Completion billed", "output tokens billed", "Compl. billed"
    ),
    Column(
        "over_reported_tokens",
        "Over-reported",
        "reported minus billed tokens, prompt and completion together",
        "Over-rep.",
    ),
    Column(
        "over_reported_pct",
        "Over-reported % of reported",
        "over-reported tokens as a share of the reported tokens (prompt and completion)",
        "Over-rep. %",
    ),
    Column(
        "unproven_prompt_tokens",
        "Prompt billed unproven",
        "billed prompt tokens taken as vLLM reported them without proof "
        "(verdicts mismatch and unaudited)",
        "Unproven prompt",
    ),
    Column(
        "unproven_completion_tokens",
        "Completion billed unproven",
        "billed completion tokens of the same records",
        "Unproven compl.",
    ),
    # Units beyond prompt and completion tokens (schema version 3), after the token
    # figures so a CSV reader that finds columns by position keeps its columns.
    Column(
        f"{Unit.CACHED}_billed",
        "Cached prompt billed",
        "prompt tokens served from the prefix cache, as vLLM reported them (part of the "
        "prompt tokens billed, not added to them)",
        "Cached",
    ),
    Column(
        f"{Unit.AUDIO}_billed",
        "Audio seconds billed",
        "seconds of audio billed, as vLLM reported them (transcriptions and translations)",
        "Audio s",
    ),
)


@dataclass
class Row:
    keys: dict[str, str]
    requests: int = 0
    prompt_tokens_reported: int = 0
    prompt_tokens_billed: int = 0
    completion_tokens_reported: int = 0
    completion_tokens_billed: int = 0
    unproven_prompt_tokens: int = 0
    unproven_completion_tokens: int = 0
    cached_prompt_tokens_billed: int = 0
    audio_seconds_billed: int = 0
    verdicts: dict[str, int] = field(default_factory=dict)
    first: datetime | None = None
    last: datetime | None = None

    @property
    def reported_tokens(self) -> int:
        return self.prompt_tokens_reported + self.completion_tokens_reported

    @property
    def billed_tokens(self) -> int:
        return self.prompt_tokens_billed + self.completion_tokens_billed

    @property
    def over_reported_tokens(self) -> int:
        return self.reported_tokens - self.billed_tokens

    @property
    def over_reported_pct(self) -> float:
        """Over-report as a share of what vLLM reported (what a reader of an invoice checks)."""
        if not self.reported_tokens:
            return 0.0
        return 100.0 * self.over_reported_tokens / self.reported_tokens

    def add(self, r: UsageRecord) -> None:
        prompt, completion = r.prompt_tokens_billed or 0, r.completion_tokens_billed or 0
        self.requests += 1
        self.prompt_tokens_reported += r.prompt_tokens_reported or 0
        self.completion_tokens_reported += r.completion_tokens_reported or 0
        self.prompt_tokens_billed += prompt
        self.completion_tokens_billed += completion
        units = r.units.quantities()
        self.cached_prompt_tokens_billed += units.cached_prompt_tokens
        self.audio_seconds_billed += units.audio_seconds
        verdict = r.verdict or "none"
        self.verdicts[verdict] = self.verdicts.get(verdict, 0) + 1
        if verdict in UNPROVEN:
            self.unproven_prompt_tokens += prompt
            self.unproven_completion_tokens += completion
        self._seen(r.time, r.time)

    def merge(self, other: Row) -> None:
        self.requests += other.requests
        self.prompt_tokens_reported += other.prompt_tokens_reported
        self.prompt_tokens_billed += other.prompt_tokens_billed
        self.completion_tokens_reported += other.completion_tokens_reported
        self.completion_tokens_billed += other.completion_tokens_billed
        self.unproven_prompt_tokens += other.unproven_prompt_tokens
        self.unproven_completion_tokens += other.unproven_completion_tokens
        self.cached_prompt_tokens_billed += other.cached_prompt_tokens_billed
        self.audio_seconds_billed += other.audio_seconds_billed
        for verdict, count in other.verdicts.items():
            self.verdicts[verdict] = self.verdicts.get(verdict, 0) + count
        if other.first and other.last:
            self._seen(other.first, other.last)

    def _seen(self, first: datetime, last: datetime) -> None:
        self.first = first if self.first is None else min(self.first, first)
        self.last = last if self.last is None else max(self.last, last)

    def value(self, name: str) -> int | float:
        if name == "over_reported_pct":
            return round(self.over_reported_pct, 2)
        return int(getattr(self, name))

    def as_dict(self) -> dict[str, object]:
        return {
            **self.keys,
            **{c.name: self.value(c.name) for c in COLUMNS},
            "verdicts": dict(sorted(self.verdicts.items())),
            "first_record": _when(self.first),
            "last_record": _when(self.last),
        }


def _when(moment: datetime | None) -> str | None:
    return moment.isoformat(timespec="seconds") if moment else None


@dataclass(frozen=True, slots=True)
class BudgetRow:
    """One budget of a limits file in the period holding the report's end (worked out by
    ``proxy.limits.budgets`` and handed in by the command: the ledger knows no policies)."""

    scope: str  # "acme", "acme / model big", "acme / key 3f2a9c01b7d4"
    budget: str  # the limit's name: prompt_tokens_per_month
    period_start: str  # ISO 8601, in the limits file's time zone
    period_end: str
    used: int
    amount: int
    currency: str | None = None  # a money budget: used and amount are billionths of it
    # Which moments its period holds: "report end" (just before --until), "now" (what
    # admission enforces today), or both.
    holds: tuple[str, ...] = ()

    @property
    def remaining(self) -> int:
        return max(self.amount - self.used, 0)

    @property
    def percent(self) -> float:
        return round(100 * self.used / self.amount, 2)

    def said(self, units: int) -> str:
        """A figure as the report writes it: a count, or an amount of the currency."""
        return plain(from_nanos(units)) if self.currency else f"{units:,}"

    def as_dict(self) -> dict[str, object]:
        figures = (self.used, self.amount, self.remaining)
        # money as exact decimal strings, never a float
        used, amount, remaining = (
            (plain(from_nanos(f)) for f in figures) if self.currency else figures
        )
        return {
            "scope": self.scope,
            "budget": self.budget,
            "period_start": self.period_start,
            "period_end": self.period_end,
            "used": used,
            "amount": amount,
            "remaining": remaining,
            "used_percent": self.percent,
            **({"currency": self.currency} if self.currency else {}),
            "holds": list(self.holds),
        }


@dataclass
class Report:
    group_by: tuple[str, ...]
    rows: list[Row]
    subtotals: list[Row]
    totals: Row
    since: str | None
    until: str | None
    generated_at: str
    budgets: tuple[BudgetRow, ...] = ()  # with ``--limits``: each budget's period so far
    charges: Charges | None = None  # with ``--prices``: the records priced at their time
    zone: str = "UTC"  # dates without an offset are read, and days grouped, in this zone
    source: str = ""  # where the records were read, in one sentence

    @property
    def first_record(self) -> str | None:
        return _when(self.totals.first)

    @property
    def last_record(self) -> str | None:
        return _when(self.totals.last)

    @property
    def start(self) -> str | None:
        """The range's start: the --since asked for, else the first record's time."""
        return self.since or self.first_record

    @property
    def end(self) -> str | None:
        """The range's (exclusive) end: the --until asked for, else when the report was made."""
        return self.until or self.generated_at or None

    @property
    def period(self) -> str:
        start = self.since or f"{self.first_record or '-'} (first record)"
        end = self.until or f"{self.generated_at} (report time)"
        return f"{start} to {end}"

    @property
    def verdicts(self) -> list[str]:
        """The verdict columns: every known verdict, then any other the records carry."""
        return [*VERDICTS, *sorted(set(self.totals.verdicts) - set(VERDICTS))]

    def subtotal_of(self, tenant: str) -> Row | None:
        return next((s for s in self.subtotals if s.keys["tenant"] == tenant), None)


def _key(record: UsageRecord, group: str, zone: tzinfo) -> str:
    if group == "day":
        return record.time.astimezone(zone).date().isoformat()
    value = getattr(record, group)
    return str(value) if value else "-"


def row_key(record: UsageRecord, group_by: Sequence[str], zone: tzinfo = UTC) -> tuple[str, ...]:
    """The row of the report grouped by ``group_by`` (a day is one of ``zone``) that
    ``record`` is counted in."""
    return tuple(_key(record, g, zone) for g in group_by)


def aggregate(
    records: Iterable[UsageRecord],
    *,
    group_by: Sequence[str] = ("tenant", "model", "operation"),
    since: str | None = None,
    until: str | None = None,
    generated_at: str = "",
    zone: tzinfo = UTC,
    source: str = "",
    charges: Charges | None = None,
    budgets: tuple[BudgetRow, ...] = (),
) -> Report:
    """Requests and reported/billed prompt and completion tokens per group (a day is one
    of ``zone``); a subtotal per tenant when the report is grouped by tenant and something
    else; the totals. ``source``, ``charges`` and ``budgets`` are carried as given (where
    the records were read, their amounts, each budget's period so far)."""
    rows: dict[tuple[str, ...], Row] = {}
    for r in records:
        key = row_key(r, group_by, zone)
        row = rows.get(key)
        if row is None:
            row = rows[key] = Row(dict(zip(group_by, key, strict=True)))
        row.add(r)
    ordered = [rows[k] for k in sorted(rows)]
    totals = Row({g: "" for g in group_by} | ({group_by[0]: "TOTAL"} if group_by else {}))
    for row in ordered:
        totals.merge(row)
    subtotals = _subtotals(group_by, ordered)
    return Report(
        tuple(group_by),
        ordered,
        subtotals,
        totals,
        since,
        until,
        generated_at,
        budgets=budgets,
        charges=charges,
        zone=str(zone),
        source=source,
    )


def _subtotals(group_by: Sequence[str], rows: list[Row]) -> list[Row]:
    if len(group_by) < 2 or group_by[0] != "tenant":
        return []
    per_tenant: dict[str, Row] = {}
    for row in rows:
        tenant = row.keys["tenant"]
        if tenant not in per_tenant:
            per_tenant[tenant] = Row({g: "" for g in group_by} | {"tenant": tenant})
        per_tenant[tenant].merge(row)
    return list(per_tenant.values())


def columns_reference() -> str:
    """docs/metering.md's rows for the report's figures (``make docs`` writes them)."""
    return "".join(f"| `{c.name}` | {c.meaning} |\n" for c in COLUMNS)
