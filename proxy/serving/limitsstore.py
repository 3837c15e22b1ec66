"""The limits store as the application wires it (``--limits-store``): its URL (valkey://
is redis://), its password (from the environment or a file, never the command line), one
client with a bounded pool and no retries, the guarded limiter on it, and this replica's
heartbeat in it (a cleanup_ctx)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

import structlog
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from proxy.limits.policy import FailMode, Policies
from proxy.limitstore.redislimiter import RedisLimiter
from proxy.metrics import Metrics
from proxy.serving.startup import file_problem
from proxy.serving.storeguard import GuardedLimiter
from proxy.settings import ENV_PREFIX, Settings

log = structlog.get_logger("proxy.serving.limitsstore")

HEARTBEAT_SECONDS = 5.0
RENEWALS_PER_TTL = 3  # the holds of live requests are extended this often per TTL
SLOTS = 8  # requests' store calls at once (more queue longer on the loop inside the timeout)


def store_password(settings: Settings) -> str | None:
    """The store's password: from the environment, or a file (never the command line)."""
    password = os.environ.get(ENV_PREFIX + "LIMITS_STORE_PASSWORD")
    path = settings.limits_store_password_file
    if path is not None:
        try:
            password = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            fix = "mount the store's password there as a UTF-8 text file (one line)"
            raise file_problem(exc, "--limits-store-password-file", path, fix) from None
    return password or None


def connect(
    url: str, *, timeout: float, password: str | None = None, connections: int = SLOTS + 2
) -> Redis:
    """A client of the store (valkey:// is redis://): a bounded pool that opens its
    connections on first use, every socket operation bounded by ``timeout``, and no
    retries, set here rather than left to the library (whose default differs by
    constructor and release: redis-py 8's ``Redis()`` retries ten times with backoff):
    a reservation is not idempotent, so a script sent again after its answer was lost
    would reserve twice; a broken call is a store failure for the fail mode to decide,
    and no reconnection stretches a wait. (A pooled connection the server closed while
    idle is found at checkout and opened again before anything is sent: redis-py 8 does
    that, 5 did not.)"""
    for alias, scheme in (("valkeys://", "rediss://"), ("valkey://", "redis://")):
        if url.startswith(alias):
            url = scheme + url.removeprefix(alias)
    pool = BlockingConnectionPool.from_url(
        url,
        password=password,
        max_connections=connections,
        timeout=None,  # the requests wait for a slot instead (GuardedLimiter.slots)
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
    )
    return Redis.from_pool(pool)  # owns the pool: aclose disconnects it


def build_shared_limiter(
    settings: Settings, policies: Policies, metrics: Metrics | None = None
) -> GuardedLimiter:
    """``--limits-store``: the limiter on Redis/Valkey, behind its timeout, breaker and
    fail mode."""
    assert settings.limits_store is not None
    timeout = settings.limits_store_timeout
    client = connect(settings.limits_store, timeout=timeout, password=store_password(settings))
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
