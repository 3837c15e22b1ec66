"""The floor of our stack: a minimal aiohttp relay (one session, streamed both ways).

    python bench/minimal_relay.py UPSTREAM PORT [JOURNAL]

With JOURNAL, the floor of a durable ledger in front of the same relay: before an
answer's end is released, one 600-byte row per request is committed to SQLite in WAL
mode with ``synchronous=FULL`` (what ``--durability sync`` promises), by one thread that
commits whatever is pending in one transaction (group commit), as the proxy's journal
does. No parsing, no accounting: what remains is the cost of the fsync'd commit.

It runs on the event loop USAGE_PROXY_EVENT_LOOP names, as the proxy does: uvloop (the
default) or asyncio.
"""

from __future__ import annotations

import asyncio
import os
import queue
import sqlite3
import sys
import threading
import uuid

import aiohttp
import uvloop
from aiohttp import web

HOP = {"connection", "keep-alive", "transfer-encoding", "host", "content-length"}
ROW = "x" * 600
LEDGER = web.AppKey("ledger", "Ledger")


class Ledger:
    """Rows committed by one thread, each group in one fsync'd transaction."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._pending: queue.SimpleQueue[tuple[str, asyncio.Future[None]]] = queue.SimpleQueue()
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        db = sqlite3.connect(self._path, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute(
            "CREATE TABLE IF NOT EXISTS records (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
            "record_id TEXT NOT NULL UNIQUE, body TEXT NOT NULL)"
        )
        while True:
            group = [self._pending.get()]
            while not self._pending.empty():
                group.append(self._pending.get())
            db.execute("BEGIN")
            db.executemany(
                "INSERT INTO records(record_id, body) VALUES (?, ?)", [(r, ROW) for r, _ in group]
            )
            db.execute("COMMIT")
            self._loop.call_soon_threadsafe(_settle, [f for _, f in group])

    async def commit(self) -> None:
        future = self._loop.create_future()
        self._pending.put((str(uuid.uuid4()), future))
        await future


def _settle(futures: list[asyncio.Future[None]]) -> None:
    for future in futures:
        future.set_result(None)


async def relay(request: web.Request) -> web.StreamResponse:
    session: aiohttp.ClientSession = request.app["session"]
    headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
    url = request.app["upstream"] + request.rel_url.raw_path_qs
    async with session.request(
        request.method, url, headers=headers, data=await request.read()
    ) as upstream:
        out = web.StreamResponse(
            status=upstream.status,
            headers={k: v for k, v in upstream.headers.items() if k.lower() not in HOP},
        )
        ledger = request.app.get(LEDGER)
        if ledger is not None:  # the answer is held until its row is on disk
            answer = await upstream.read()
            await ledger.commit()
            await out.prepare(request)
            await out.write(answer)
        else:
            await out.prepare(request)
            async for chunk in upstream.content.iter_any():
                await out.write(chunk)
        await out.write_eof()
        return out


async def session_ctx(app: web.Application):  # type: ignore[no-untyped-def]
    app["session"] = aiohttp.ClientSession(auto_decompress=False)
    if app["journal"]:
        app[LEDGER] = Ledger(app["journal"])
    yield
    await app["session"].close()


if __name__ == "__main__":
    app = web.Application(client_max_size=1 << 26)
    app["upstream"] = sys.argv[1]
    app["journal"] = sys.argv[3] if len(sys.argv) > 3 else None
    app.cleanup_ctx.append(session_ctx)
    app.router.add_route("*", "/{tail:.*}", relay)
    kind = os.environ.get("USAGE_PROXY_EVENT_LOOP", "uvloop")
    loop = uvloop.new_event_loop() if kind == "uvloop" else asyncio.new_event_loop()
    web.run_app(
        app, host="127.0.0.1", port=int(sys.argv[2]), print=None, access_log=None, loop=loop
    )
