"""The limits store as the application wires it: the guarded limiter on a client of the
store, built from the settings (the password given by the caller: it is read where a
missing file is a start-up error), and this replica's heartbeat in it (a cleanup_ctx)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import structlog

from proxy.limits.policy import FailMode, Policies
from proxy.limitstore.client import SLOTS, connect
from proxy.limitstore.guard import GuardedLimiter
from proxy.limitstore.redislimiter import RedisLimiter
from proxy.metrics import Metrics
from proxy.settings import Settings

log = structlog.get_logger("proxy.limitstore.wiring")

HEARTBEAT_SECONDS = 5.0

RENEWALS_PER_TTL = 3  # the holds of live requests are extended this often per TTL


def build_shared_limiter(
    settings: Settings,
    policies: Policies,
    metrics: Metrics | None = None,
    *,
    password: str | None = None,
) -> GuardedLimiter:
    """``--limits-store``: the limiter on Redis/Valkey, behind its timeout, breaker and
    fail mode; ``password``: the store's (``serving.startup.store_password``)."""
    assert settings.limits_store is not None
    timeout = settings.limits_store_timeout
    client = connect(settings.limits_store, timeout=timeout, password=password)
    shared = RedisLimiter(
        policies,
        client,
        replica=settings.instance,
        reservation_ttl=settings.limits_reservation_ttl,
        grace=3 * HEARTBEAT_SECONDS,
    )
    return GuardedLimiter(
        shared,
        timeout=timeout,
        fail_mode=FailMode(settings.limits_fail_mode),
        replicas=settings.limits_replicas,
        metrics=metrics,
        slots=SLOTS,
    )


def store_context(
    limiter: GuardedLimiter, *, journaled: bool
) -> Callable[[Any], AsyncIterator[None]]:
    """cleanup_ctx: this replica's heartbeat in the store (the live count divides the
    limits in local fail mode unless --limits-replicas fixes it), which contributes its
    journal once it is read (at once without a journal) and extends the holds of its
    requests in flight (every TTL / 3, one round trip); the client closed."""

    async def ctx(app: Any) -> AsyncIterator[None]:
        limiter.restored = limiter.restored or not journaled

        async def beat() -> None:
            loop = asyncio.get_running_loop()
            # the holds of requests in flight are extended well before their TTL ends
            renewal = limiter.shared.reservation_ttl / RENEWALS_PER_TTL
            beat_due = renew_due = loop.time()
            while True:
                now = loop.time()
                if now >= beat_due:
                    beat_due = now + HEARTBEAT_SECONDS
                    count = await limiter.beat(3 * HEARTBEAT_SECONDS)
                    log.debug("limits_replicas", live=count, dividing_by=limiter.replicas)
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
