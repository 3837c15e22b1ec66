"""Raw client sockets for the resource tests: a request that never sends its whole body,
a client that never reads its answer."""

from __future__ import annotations

import asyncio
import socket
from typing import Any


async def trickle(
    port: int, path: str, length: int, first: bytes, sock: socket.socket | None = None
) -> tuple[Any, Any]:
    """Open a request announcing ``length`` body bytes and send only ``first`` (all of
    it when ``first`` is the whole body); on ``sock`` when given, already connected."""
    if sock is None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    else:  # a stream reader's buffer of 256 KiB
        reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 17)
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n".encode()
        + first
    )
    await writer.drain()
    return reader, writer


async def reads_nothing(port: int, path: str, body: bytes) -> tuple[Any, Any]:
    """Send one request, then read nothing: with a 64 KiB receive buffer (and the stream
    reader's 256 KiB), the proxy's send buffer fills after a few MiB of answer and stays
    full."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return await trickle(port, path, len(body), body, sock)
