"""The guarded limiter's calls to the store: each within the timeout and timed, a failure
counted by kind and told to the breaker, a success closing it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TypeVar

import structlog

from proxy.limitstore.remainders import Remainders

log = structlog.get_logger("proxy.limitstore.calls")
T = TypeVar("T")


class StoreCalls(Remainders):
    """The store calls of the guarded limiter."""

    async def _call(self, op: str, call: Awaitable[T]) -> T:
        started = time.monotonic()
        try:
            async with asyncio.timeout(self.timeout):
                return await call
        finally:
            took = time.monotonic() - started
            self.slowest = max(self.slowest, took)
            if self.metrics is not None:
                self.metrics.store_seconds.labels(op).observe(took)

    def _failed(self, op: str, exc: BaseException) -> None:
        kind = "timeout" if isinstance(exc, TimeoutError) else type(exc).__name__
        self.errors[kind] = self.errors.get(kind, 0) + 1
        self.reachable = False
        if self.failing_since is None:  # the store stopped answering this replica
            self.failing_since = self._clock()
        self.breaker.failed(self._clock())
        if self.metrics is not None:
            self.metrics.store_errors.labels(kind).inc()
            self.metrics.store_breaker.set(int(self.breaker.open))
        log.warning("limits_store_failed", op=op, error=kind, breaker_open=self.breaker.open)

    def _succeeded(self) -> bool:
        """The store answered; whether the breaker was open (it is back)."""
        self.reachable = True
        self.failing_since = None
        if self.metrics is not None:
            self.metrics.store_breaker.set(0)
        return self.breaker.succeeded()
