"""A realtime session on a shared limits store keeps its concurrency hold for as long as
it lives, past the reservation TTL (the heartbeat renews it)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from proxy.serving.admission import ADMISSION
from tests.support.proxies import limited_proxy
from tests.support.redisserver import Store


async def test_a_long_session_keeps_its_concurrency_hold_on_the_store(
    aiohttp_server: Any,
    aiohttp_client: Any,
    minilm_path: Path,
    tmp_path: Path,
    redis_store: Store,
) -> None:
    """concurrency: 1 on a shared store; a realtime session still open after the
    reservation TTL (0.3 s here, 600 s by default) still holds the tenant's one slot, so
    a second session is refused 429."""
    _, client = await limited_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        tmp_path,
        {"tenants": {"acme": {"concurrency": 1}}},
        version="0.32.0",
        limits_store=redis_store.url,
        limits_store_timeout=0.5,
        limits_replicas=1,
        limits_reservation_ttl=0.3,
    )
    client_limiter = client.app[ADMISSION].limiter
    assert await client_limiter.contribute()
    acme = {"X-Tenant-Id": "acme"}
    async with client.ws_connect("/v1/realtime", headers=acme) as first:
        await first.receive(timeout=5)
        with pytest.raises(aiohttp.WSServerHandshakeError) as caught:
            await client.ws_connect("/v1/realtime", headers=acme)
        assert caught.value.status == 429  # the slot is held
        await asyncio.sleep(0.5)  # the session lives on past the reservation's TTL
        try:
            second = await client.ws_connect("/v1/realtime", headers=acme)
        except aiohttp.WSServerHandshakeError as exc:
            status = exc.status
        else:
            status = 101  # admitted: two sessions under concurrency 1
            await second.close()
        assert status == 429
