"""Exporters: where journaled usage records are delivered (at least once)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from proxy.records import UsageRecord


class Sink(Protocol):
    """A delivery target. ``deliver`` raises on failure; the outbox retries the batch."""

    name: str

    async def start(self) -> None: ...

    async def deliver(self, records: Sequence[UsageRecord]) -> None: ...

    async def close(self) -> None: ...
