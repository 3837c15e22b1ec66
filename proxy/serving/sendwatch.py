"""Clients that stop reading: disconnected after ``--send-timeout`` without progress.

A client that keeps its connection open but reads nothing stops the proxy's writes once
the connection's send buffer is full. aiohttp has no send deadline, so the handler then
waits for as long as the client likes, holding what the answer holds: an upstream
connection while an answer is passed on as it comes (``--upstream-connections`` such
clients starve everyone else), or a whole answer in memory while a held one is written.

Every client connection that made a request is watched. A sweep every quarter of the
timeout (at most every second) reads each transport's write buffer and, where that is
not empty, the bytes the kernel still holds for the client, unacknowledged (a few MiB
fit there, and the socket only takes more once much of them has gone): an empty buffer,
or either figure changed since the last sweep, is progress; the same figures for
``timeout`` seconds are a client that accepted nothing, and its connection is aborted.
The writer then sees the client gone, as if it had hung up: a metered answer is still
read to its end and billed, marked aborted. A request's path pays one weak-set insertion.
"""

from __future__ import annotations

import asyncio
import fcntl
import struct
import termios
import weakref
from collections.abc import AsyncIterator, Callable
from typing import cast

import structlog
from aiohttp import web

from proxy.metrics import Metrics

log = structlog.get_logger("proxy.serving.sendwatch")


class SendWatch:
    """The client connections that made a request, swept for ones that take nothing."""

    def __init__(self, timeout: float, metrics: Metrics) -> None:
        self.timeout = timeout
        self.interval = min(1.0, timeout / 4)
        self._metrics = metrics
        self._watched: weakref.WeakSet[asyncio.BaseTransport] = weakref.WeakSet()
        # transport -> (its unsent bytes, when they were first seen so)
        self._stuck: dict[asyncio.WriteTransport, tuple[tuple[int, int], float]] = {}

    def watch(self, transport: asyncio.BaseTransport | None) -> None:
        if transport is not None:
            self._watched.add(transport)

    def sweep(self, now: float) -> None:
        """Abort the connections whose send buffer has not moved for ``timeout``."""
        stuck: dict[asyncio.WriteTransport, tuple[tuple[int, int], float]] = {}
        for transport in list(self._watched):
            # Duck-typed: uvloop's transports are no subclasses of asyncio.WriteTransport.
            if transport.is_closing() or not hasattr(transport, "get_write_buffer_size"):
                continue
            transport = cast(asyncio.WriteTransport, transport)
            size = transport.get_write_buffer_size()
            if not size:
                continue
            unsent = (size, in_kernel(transport))
            seen = self._stuck.get(transport)
            if seen is None or seen[0] != unsent:
                stuck[transport] = (unsent, now)
            elif now - seen[1] >= self.timeout:
                self._cut(transport, unsent)
            else:
                stuck[transport] = seen
        self._stuck = stuck

    def _cut(self, transport: asyncio.WriteTransport, unsent: tuple[int, int]) -> None:
        log.warning(
            "client_stalled",
            peer=str(transport.get_extra_info("peername")),
            unsent_bytes=sum(unsent),
            send_timeout=self.timeout,
        )
        self._metrics.stalled_clients.inc()
        transport.abort()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.interval)
            try:
                self.sweep(loop.time())
            except Exception:  # one odd connection must not end the watch for all
                log.exception("send_watch_failed")


def in_kernel(transport: asyncio.BaseTransport) -> int:
    """Bytes written to the transport's socket that the client has not acknowledged
    (``TIOCOUTQ``); 0 when there is no socket to ask."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return 0
    try:
        out = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    except OSError:
        return 0
    return int(struct.unpack("i", out)[0])


def send_watch_context(watch: SendWatch) -> Callable[[web.Application], AsyncIterator[None]]:
    """cleanup_ctx: the watch's sweeping task, for the application's lifetime."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(watch.run(), name="send-watch")
        yield
        task.cancel()

    return ctx
