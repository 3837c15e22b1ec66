"""Exporters: where journaled usage records are delivered (at least once)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from proxy.ledger.windows import Entry


class PermanentDeliveryError(Exception):
    """The receiver rejected the batch for what it contains: retrying the same records
    cannot succeed. The outbox splits the batch to isolate the offending records, delivers
    the rest and moves those to the dead-letter store. Any other exception is transient
    and the batch is retried with backoff."""


class RetryLater(Exception):
    """A transient failure with the receiver's own wait (``Retry-After``), in seconds."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Sink(Protocol):
    """A delivery target for usage records and reconciliation windows. ``deliver`` raises
    on failure; the outbox retries the batch (or isolates a permanent rejection)."""

    name: str

    async def start(self) -> None: ...

    async def deliver(self, records: Sequence[Entry]) -> None: ...

    async def close(self) -> None: ...
