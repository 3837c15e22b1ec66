"""The shared limiter's lifetime while the application serves (its ``cleanup_ctx``): this
replica's heartbeat in the store, whose live count divides the limits in local fail mode
unless --limits-replicas fixes it, which contributes its journal once it is read (at once
without a journal), and the renewal of the holds of its requests in flight (every TTL /
3, one round trip); the limiter closed after."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, Protocol

import structlog

from proxy.limits.limiter import Lifetime

log = structlog.get_logger("proxy.limitstore.upkeep")

HEARTBEAT_SECONDS = 5.0
RENEWALS_PER_TTL = 3  # the holds of live requests are extended this often per TTL


class Beating(Protocol):
    """What the lifetime runs of a limiter on a store."""

    def ready(self, *, journaled: bool) -> None: ...

    def renewal(self) -> float: ...

    async def beat(self, ttl: float) -> int | None: ...

    async def renew(self) -> int | None: ...

    async def close(self) -> None: ...


def store_lifetime(limiter: Beating, *, journaled: bool) -> Lifetime:
    """cleanup_ctx: the heartbeat and the renewals, then the limiter closed."""

    async def ctx(app: Any) -> AsyncIterator[None]:
        limiter.ready(journaled=journaled)

        async def beat() -> None:
            loop = asyncio.get_running_loop()
            renewal = limiter.renewal()  # well before the holds' TTL ends
            beat_due = renew_due = loop.time()
            while True:
                now = loop.time()
                if now >= beat_due:
                    beat_due = now + HEARTBEAT_SECONDS
                    count = await limiter.beat(3 * HEARTBEAT_SECONDS)
                    log.debug("limits_replicas", live=count)
                if now >= renew_due:
                    renew_due = now + renewal
                    await limiter.renew()
                await asyncio.sleep(max(min(beat_due, renew_due) - loop.time(), 0.0))

        task = asyncio.get_running_loop().create_task(beat())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await limiter.close()

    return ctx
