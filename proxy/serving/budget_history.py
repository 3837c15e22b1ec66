"""The budgets' history rebuilt from a journal (a restart keeps the month): what a
process's own journal billed, or, in a pod, each worker's shard for the limiter host the
supervisor runs. Light to import: the supervisor needs it without the application."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

from proxy.accounting.prices import PriceTable
from proxy.accounting.units import Quantities
from proxy.ledger.journal import Journal
from proxy.ledger.sqlite import UsageSum
from proxy.limits.costs import billed
from proxy.limits.history import BUCKET_SECONDS
from proxy.limits.limiter import Cost, Usage, Who
from proxy.limits.periods import earliest_start
from proxy.limits.policy import Policies


async def shard_history(
    path: Path, since: datetime, table: PriceTable | None
) -> tuple[list[Usage], int]:
    """``journal_history`` of the shard at ``path``, opened for the read (none if it does
    not exist)."""
    if not await asyncio.to_thread(path.is_file):
        return [], 0
    journal = Journal(path)
    await journal.open()
    try:
        return await journal_history(journal, since, table)
    finally:
        await journal.close()


def history_start(policies: Policies, now: float) -> datetime:
    """Where the budgets' history starts: the earliest period start in their zone."""
    return datetime.fromtimestamp(earliest_start(now, policies.zone), UTC)


async def journal_history(
    journal: Journal, since: datetime, table: PriceTable | None
) -> tuple[list[Usage], int]:
    """What ``journal`` billed from ``since`` (by tenant, model, key and quarter hour,
    its money at the price in force over it), as budgets are rebuilt from it; and how many
    records that is."""
    cuts = table.cuts() if table is not None else []
    sums = await journal.usage_since(since, BUCKET_SECONDS, cuts)
    history = [
        Usage(
            Who(s.tenant, s.model, s.key_hash),
            float(s.start),
            Cost(s.prompt, s.completion, s.records, _money_of(s, table, cuts)),
        )
        for s in sums
    ]
    return history, sum(s.records for s in sums)


def _money_of(s: UsageSum, table: PriceTable | None, cuts: list[datetime]) -> int:
    """A journal sum's money: its units at the one price in force over it (a sum never
    spans a price change: the journal splits it at ``cuts``), rounded up to a billionth
    once per sum (a settlement rounds once per record: never less than this)."""
    if table is None:
        return 0
    at = datetime.fromtimestamp(s.start, UTC)
    if s.segment > 0:  # its records are at or after the cut that began their segment
        at = max(at, cuts[s.segment - 1])
    q = Quantities(s.prompt, s.completion, s.cached, s.audio)
    return billed(table, s.model, q, at, 0)[0]
