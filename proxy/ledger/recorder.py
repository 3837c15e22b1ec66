"""The recorder: usage records into the journal, then to its subscribers.

Recording never fails a client request: a record that cannot be journaled is logged and
counted, and the caller flags the answer (``x-usage-record: failed``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import structlog

from proxy.ledger.journal import Journal, JournalError
from proxy.ledger.records import UsageRecord
from proxy.metrics import Metrics

log = structlog.get_logger("proxy.ledger.recorder")

Subscriber = Callable[[UsageRecord], None]


class Recorder:
    """Journals each record (when a journal is configured) and tells ``subscribers`` of
    every record that was journaled (the reconciler's tally)."""

    def __init__(
        self, journal: Journal | None, metrics: Metrics, subscribers: Sequence[Subscriber] = ()
    ) -> None:
        self.journal = journal
        self._metrics = metrics
        self._subscribers = tuple(subscribers)
        self.failed = 0

    async def record(self, record: UsageRecord) -> bool:
        """Journal a record; False (logged, counted) when it could not be journaled."""
        if self.journal is not None:
            try:
                await self.journal.append(record)
            except JournalError as exc:
                self.failed += 1
                self._metrics.journal_failures.inc()
                log.error(
                    "record_not_journaled",
                    record_id=record.record_id,
                    error=str(exc),
                    tenant=record.tenant,
                    prompt_tokens_billed=record.prompt_tokens_billed,
                )
                return False
        for subscriber in self._subscribers:
            subscriber(record)
        return True
