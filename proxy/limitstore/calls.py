"""The guarded limiter's calls to the store: each within the timeout and timed, in one of
a bounded number of slots, a failure counted by kind and told to the circuit breaker, a
success closing it; and whether the store answers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import structlog

from proxy.limitstore.breaker import Breaker
from proxy.metrics import Metrics

log = structlog.get_logger("proxy.limitstore.calls")
T = TypeVar("T")


class StoreCalls:
    """The store calls of the guarded limiter, and what they found."""

    def __init__(
        self,
        timeout: float,
        *,
        breaker: Breaker | None = None,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        slots: int = 8,
    ) -> None:
        self.timeout = timeout
        self.breaker = breaker or Breaker()
        self.metrics = metrics
        self.clock = clock
        # requests' store calls in flight at once (the pool's connections for them): the
        # wait for a slot is not a store failure and does not count in ``timeout``
        self.slots = asyncio.Semaphore(slots)
        self.errors: dict[str, int] = {}  # store failures by kind
        self.reachable = True  # whether the store answered the last call
        # when the store stopped answering (this process's clock), None while it answers
        self.failing_since: float | None = None
        self.slowest = 0.0  # the longest a store call took (failed ones included), seconds

    def allows(self) -> bool:
        """Whether the breaker lets a call try the store now."""
        return self.breaker.allows(self.clock())

    async def call(self, op: str, call: Awaitable[T]) -> T:
        started = time.monotonic()
        try:
            async with asyncio.timeout(self.timeout):
                return await call
        finally:
            took = time.monotonic() - started
            self.slowest = max(self.slowest, took)
            if self.metrics is not None:
                self.metrics.store_seconds.labels(op).observe(took)

    def failed(self, op: str, exc: BaseException) -> None:
        kind = "timeout" if isinstance(exc, TimeoutError) else type(exc).__name__
        self.errors[kind] = self.errors.get(kind, 0) + 1
        self.reachable = False
        if self.failing_since is None:  # the store stopped answering this replica
            self.failing_since = self.clock()
        self.breaker.failed(self.clock())
        if self.metrics is not None:
            self.metrics.store_errors.labels(kind).inc()
            self.metrics.store_breaker.set(int(self.breaker.open))
        log.warning("limits_store_failed", op=op, error=kind, breaker_open=self.breaker.open)

    def succeeded(self) -> bool:
        """The store answered a request's call; whether the breaker was open (it is
        back)."""
        self.answered()
        if self.metrics is not None:
            self.metrics.store_breaker.set(0)
        return self.breaker.succeeded()

    def answered(self) -> None:
        """The store answered (a heartbeat's call: the breaker is the requests')."""
        self.reachable = True
        self.failing_since = None
