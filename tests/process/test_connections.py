"""The real server's connections: beyond --max-connections refused with 503 and closed;
idle, silent and slow-header connections closed after --keepalive-timeout."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any
from urllib.request import urlopen


async def test_connections_beyond_the_cap_get_503_and_are_closed(
    fake_upstream: Any, tmp_path: Path
) -> None:
    """Regression: 20,000 trickling connections hit EMFILE and normal requests timed out.
    The real server refuses connections beyond --max-connections (vLLM-shaped 503, closed,
    counted) and serves again once they are gone."""
    from scripts.vllm_cpu import start_proxy

    proxy = start_proxy(fake_upstream.url, tmp_path, "--max-connections", "5", "--journal", "off")
    await asyncio.to_thread(proxy.wait_ready, "/readyz", 60)
    port = int(proxy.url.rsplit(":", 1)[1])
    try:
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(5)]
        await asyncio.sleep(0.2)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        answer = await asyncio.wait_for(reader.read(), 5)  # the proxy closes it
        writer.close()
        assert answer.startswith(b"HTTP/1.1 503")
        assert b'"type": "ServiceUnavailable"' in answer
        for _, w in idle:
            w.close()
        await asyncio.sleep(0.3)
        status = await asyncio.to_thread(lambda: urlopen(proxy.url + "/healthz").status)
        assert status == 200
        metrics = await asyncio.to_thread(lambda: urlopen(proxy.url + "/metrics").read())
        assert b'usage_proxy_refused_requests_total{status="503"} 1.0' in metrics
    finally:
        proxy.stop()


async def test_idle_and_slow_header_connections_are_closed(
    fake_upstream: Any, tmp_path: Path
) -> None:
    """Regression: the real server kept idle client connections for aiohttp's handler
    default of 3,630 s (the docs said 75 s), so a client that connected and sent nothing,
    or trickled its headers, held one of --max-connections for an hour. Now a connection
    with no complete request within --keepalive-timeout is closed, as is one left idle
    after its answer."""
    from scripts.vllm_cpu import start_proxy

    proxy = start_proxy(fake_upstream.url, tmp_path, "--keepalive-timeout", "1", "--journal", "off")
    await asyncio.to_thread(proxy.wait_ready, "/readyz", 60)
    port = int(proxy.url.rsplit(":", 1)[1])

    async def closed_within(
        reader: asyncio.StreamReader, seconds: float, *, still_sending: bool = False
    ) -> bytes:
        """b"" once the proxy has closed the connection. A client that is still sending
        when the proxy closes gets a reset (its kernel answers the next byte with RST, the
        write then fails with EPIPE or the read with ECONNRESET): the proxy caused it, so
        for such a client it is the close this test expects."""
        try:
            return await asyncio.wait_for(reader.read(), seconds)
        except (ConnectionResetError, BrokenPipeError):
            if not still_sending:
                raise
            return b""

    writers: list[asyncio.StreamWriter] = []
    feeding: asyncio.Task[None] | None = None
    try:
        silent, silent_w = await asyncio.open_connection("127.0.0.1", port)
        writers.append(silent_w)
        slow, slow_w = await asyncio.open_connection("127.0.0.1", port)
        writers.append(slow_w)
        used, used_w = await asyncio.open_connection("127.0.0.1", port)
        writers.append(used_w)
        slow_w.write(b"POST /rerank HTTP/1.1\r\nHost: x\r\n")
        used_w.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")

        async def trickle() -> None:
            for _ in range(20):  # one header byte every 0.2 s, never the blank line
                await asyncio.sleep(0.2)
                if slow.at_eof() or slow_w.is_closing():
                    return  # the proxy has closed it: stop sending
                slow_w.write(b"X")

        feeding = asyncio.create_task(trickle())
        assert await closed_within(silent, 5) == b""
        assert await closed_within(slow, 5, still_sending=True) == b""
        assert (await closed_within(used, 5)).startswith(b"HTTP/1.1 200")
    finally:
        if feeding is not None:
            feeding.cancel()
            await asyncio.gather(feeding, return_exceptions=True)
        for w in writers:
            w.close()
        await asyncio.gather(*(w.wait_closed() for w in writers), return_exceptions=True)
        proxy.stop()
