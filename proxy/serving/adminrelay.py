"""The admin API of a pod (``serve --workers N`` with ``--admin-tokens``; docs/workers.md,
"The admin API in a pod"): worker 0 answers it on the admin socket in the supervisor's
private runtime directory, with its own token check, limiter and record source (every
shard of the pod's journal); the supervisor relays the API's paths of ``--admin-port``
there, bytes as they are. A question without a bearer token is refused 401 by the relay
itself (worker 0's answer, known without its token digests); one with a token, while
worker 0 is restarting, is answered 503 in vLLM's error shape, with ``Retry-After``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import structlog
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.serving.pod import Place
from proxy.serving.tenancy import bearer_key, connection_tokens
from proxy.serving.upstream import HOP_BY_HOP, error_response, request_headers, unauthorized
from proxy.serving.usage_openapi import ADMIN_PREFIX

log = structlog.get_logger("proxy.serving.adminrelay")

Context = Callable[[web.Application], AsyncIterator[None]]
RETRY_SECONDS = 2
CHUNK = 64 * 1024
# A page of the most records (10,000) is read in worker 0's reading process: long
# enough for that, short of hanging an operator's client for ever on a hung worker.
ANSWER_SECONDS = 300.0
BODY_HEADERS = ("content-length", "transfer-encoding", "content-type", "content-encoding")
SESSION = web.AppKey("admin_relay_session", aiohttp.ClientSession)


def admin_socket_context(place: Place, add_api: Callable[[web.Application], None]) -> Context:
    """cleanup_ctx of worker 0: the admin API (``add_api`` adds it, token check
    included) served on the pod's admin socket for the worker's lifetime."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        api = web.Application()
        add_api(api)
        runner = web.AppRunner(api, access_log=None)
        await runner.setup()
        await web.UnixSite(runner, str(place.admin_socket)).start()
        yield
        await runner.cleanup()

    return ctx


def add_admin_relay(app: web.Application, socket: Path) -> None:
    """The supervisor's admin port relays the admin API's paths to ``socket``."""
    app.cleanup_ctx.append(_session_context(socket))
    app.router.add_route("*", ADMIN_PREFIX + "/{tail:.*}", _relay)


def _session_context(socket: Path) -> Context:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        timeout = aiohttp.ClientTimeout(total=ANSWER_SECONDS, sock_connect=5)
        # a connection per question: a kept one would be stale after worker 0 restarts
        connector = aiohttp.UnixConnector(path=str(socket), force_close=True)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            app[SESSION] = session
            yield

    return ctx


async def _relay(request: web.Request) -> web.StreamResponse:
    """One admin question, asked of worker 0 with the operator's headers (its token),
    its answer streamed back as it comes. Any method is asked, never with a body (the
    API reads none): worker 0 checks the token, then refuses all but GET (read only).
    Without a bearer token the answer is worker 0's 401, given here: it needs no token
    digests, and a 503 would only ask the operator to try again for the same refusal."""
    if bearer_key(request.headers) is None:
        return unauthorized()
    session = request.app[SESSION]
    url = "http://worker-0" + str(request.rel_url)
    headers = request_headers(request.headers)
    for framing in BODY_HEADERS:
        headers.popall(framing, None)
    response: web.StreamResponse | None = None
    try:
        async with session.request(request.method, url, headers=headers) as answer:
            response = web.StreamResponse(
                status=answer.status, headers=_answer_headers(answer.headers)
            )
            await response.prepare(request)
            async for chunk in answer.content.iter_chunked(CHUNK):
                await response.write(chunk)
            await response.write_eof()
            return response
    except (aiohttp.ClientConnectionError, TimeoutError) as exc:
        if response is not None and response.prepared:
            raise  # the answer has begun: the operator's connection ends short
        log.warning("admin_relay_failed", error=f"{type(exc).__name__}: {exc}"[:300])
        return restarting()


def _answer_headers(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    """Worker 0's headers, the API's own ``x-usage-*`` included (the relay of vLLM's
    answers drops those: here they are the answer's), less what this hop sets."""
    drop = connection_tokens(headers) | HOP_BY_HOP | {"content-length", "date", "server"}
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in drop)


def restarting() -> web.Response:
    """503 in vLLM's shape: worker 0, which answers the admin API, is not there now."""
    response = error_response(
        503, "the pod's admin API is not answering now (worker 0 is starting); ask again"
    )
    response.headers["Retry-After"] = str(RETRY_SECONDS)
    return response
