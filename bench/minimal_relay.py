"""The floor of our stack: a minimal aiohttp relay (one session, streamed both ways)."""

from __future__ import annotations

import sys

import aiohttp
from aiohttp import web

HOP = {"connection", "keep-alive", "transfer-encoding", "host", "content-length"}


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
        await out.prepare(request)
        async for chunk in upstream.content.iter_any():
            await out.write(chunk)
        await out.write_eof()
        return out


async def session_ctx(app: web.Application):  # type: ignore[no-untyped-def]
    app["session"] = aiohttp.ClientSession(auto_decompress=False)
    yield
    await app["session"].close()


if __name__ == "__main__":
    app = web.Application(client_max_size=1 << 26)
    app["upstream"] = sys.argv[1]
    app.cleanup_ctx.append(session_ctx)
    app.router.add_route("*", "/{tail:.*}", relay)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[2]), print=None, access_log=None)
