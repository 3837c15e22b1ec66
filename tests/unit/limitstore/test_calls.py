"""The guarded limiter's store calls: a silent store costs each request at most the
timeout, and the breaker spares the requests after it."""

from __future__ import annotations

import asyncio
import time

from proxy.limits.limiter import Cost
from proxy.limits.policy import FailMode
from proxy.limitstore.wiring import build_shared_limiter
from proxy.serving.startup import store_password
from proxy.settings import Settings
from tests.support.limitstores import ACME, UPSTREAM, policies


async def test_a_silent_store_costs_each_request_at_most_the_timeout() -> None:
    """A store that accepts connections and never answers: each admission waits at most
    the timeout, then the fail mode decides; after 3 failures the breaker skips the
    store and admissions cost no wait at all."""
    silent: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        silent.append(writer)  # read nothing, answer nothing

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    settings = Settings(
        upstream=UPSTREAM,
        limits_store=f"redis://127.0.0.1:{port}/0",
        limits_store_timeout=0.1,
        limits_replicas=1,
        instance="r0",
    )
    # a rate: local mode divides it without having heard from the store
    limiter = build_shared_limiter(
        settings, policies(requests_per_minute=300), password=store_password(settings)
    )
    limiter.contribution.restored = True
    waits = []
    try:
        for _ in range(6):
            started = time.monotonic()
            decision = await limiter.reserve(ACME, Cost(1, 0), time.time())
            waits.append(time.monotonic() - started)
            assert decision.ticket is not None
    finally:
        await limiter.close()
        for writer in silent:
            writer.close()
        server.close()
        await server.wait_closed()
    assert all(wait < 0.1 + 0.05 for wait in waits), waits
    assert all(wait < 0.01 for wait in waits[3:]), waits  # the breaker is open
    assert limiter.calls.errors == {"timeout": 3}
    assert limiter.mode.fail_admissions[FailMode.LOCAL] == 6
