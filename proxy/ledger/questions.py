"""The usage API's questions answered from records: a range's usage per model and
operation (the report's aggregate, priced by the report's charges), one record, and a
page of a range. Plain functions over a ``RecordSource``, run in a reading process
(``proxy.serving.usage_reads``), so they import only the ledger and accounting: a reader
starts in about a fifth of the time, at less than half the memory, of one that imports
the server."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import TypeVar

from proxy.accounting.money import plain
from proxy.accounting.prices import PriceTable
from proxy.accounting.units import Unit
from proxy.ledger.charges import charge
from proxy.ledger.lookup import After, RecordSource
from proxy.ledger.records import UsageRecord
from proxy.ledger.report import aggregate, row_key

GROUP = ("model", "operation")
T = TypeVar("T")


class ReadFailed(Exception):
    """The records could not be read (the ledger or journal failed, or a reader died);
    its message says why, and pickles back from a reading process."""


@dataclass(frozen=True, slots=True)
class Page:
    """At most a page of records as JSON lines, and the place of its last one when more
    follow (None: the last page)."""

    lines: str
    more: After | None


def read_usage(
    source: RecordSource, tenant: str, since: str, until: str, table: PriceTable | None
) -> dict[str, object]:
    """``tenant``'s billed units per model and operation in ``[since, until)``, and
    their amounts at the prices in force at each record's time."""
    records = _read(source.page, since, until, tenant)
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
        **source.describe(),
        "rows": rows,
    }
    if charges is not None and table is not None:
        mine = charges.tenant(tenant)
        body["currency"] = table.currency
        body["amount"] = plain(mine.amount) if mine else "0"
        body["due"] = str(mine.due if mine else Decimal(0).scaleb(-table.decimals))
    return body


def read_record(
    source: RecordSource, tenant: str | None, record_id: str, table: PriceTable | None
) -> dict[str, object] | None:
    """A record by id, with the source it was read from; None when there is none, or it
    is another tenant's (the same answer: nothing leaks by existence)."""
    found = _read(source.located, record_id)
    if found is None or (tenant is not None and found[0].tenant != tenant):
        return None
    record, read_from = found
    return {**read_from, "record": record_json(record, table)}


def read_page(
    source: RecordSource,
    since: str,
    until: str,
    tenant: str | None,
    after: After | None,
    limit: int,
) -> Page:
    """A page of the range's records as JSON lines (one record more than the page is
    read: whether another page follows)."""
    found = _read(source.places, since, until, tenant, after, limit + 1)
    page = found[:limit]
    lines = "".join(record.to_json() + "\n" for _, record in page)
    return Page(lines, page[-1][0] if len(found) > limit else None)


def _read(fn: Callable[..., T], *args: object) -> T:
    """A source's read; whatever fails in it (the ledger down, a damaged journal) is
    said as ``ReadFailed``, which pickles back whatever the driver's error was."""
    try:
        return fn(*args)
    except Exception as exc:  # any driver's error, said once
        raise ReadFailed(f"the records cannot be read now: {type(exc).__name__}: {exc}") from None


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
