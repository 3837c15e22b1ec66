"""The store's client: a broken call is neither retried nor sent again (a reservation is
not idempotent)."""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.exceptions import RedisError

from proxy.limitstore.client import connect


async def test_a_broken_call_is_neither_retried_nor_sent_again() -> None:
    """The store's client retries nothing, whatever the library's default (redis-py 6 and
    later retry three times): a store that reads a call and drops the connection sees
    one connection and the call once, and the caller gets the error at once, for the
    fail mode to decide (a reservation sent again would reserve twice)."""
    accepted: list[bytes] = []

    async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(await reader.read(65536))  # the call (and any handshake), then gone
        writer.close()

    server = await asyncio.start_server(drop, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = connect(f"redis://127.0.0.1:{port}/0", timeout=2.0)
    started = time.monotonic()
    with pytest.raises(RedisError):
        await client.ping()
    assert time.monotonic() - started < 1.0  # no backoff between attempts
    assert len(accepted) == 1, accepted
    await client.aclose()
    server.close()
    await server.wait_closed()
