"""Wiring: build the aiohttp application from settings and its collaborators."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import resource
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import structlog
from aiohttp import web

from proxy import __version__, health
from proxy.audit import ScoringAuditor
from proxy.catalog import CATALOG, Catalog, catalog_context
from proxy.dispatch import SCORING_OPERATIONS, prepare
from proxy.exchanges import BODIES, BodyBudget, handle_admitted, off_loop, tune_allocator
from proxy.logs import configure_logging
from proxy.metered import METERED, METERED_PATHS, MeteredRelay
from proxy.metering import METER, attribution, meter_context
from proxy.metrics import METRICS, Metrics, admin_context, serve_metrics
from proxy.relay import Relay
from proxy.sendwatch import SENDS, send_watch_context
from proxy.settings import Settings
from proxy.settler import settler_context
from proxy.shapes import INVOCATIONS_PATH, RERANK_PATHS, SCORE_PATHS
from proxy.sinks import Sink
from proxy.tokenizer import TokenizerPool
from proxy.upstream import error_response, session_context

log = structlog.get_logger("proxy.app")

POOL = web.AppKey("tokenizer_pool", TokenizerPool)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def pool_context(pool: TokenizerPool) -> Callable[[web.Application], AsyncIterator[None]]:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        app[POOL] = pool
        yield
        pool.shutdown()

    return ctx


@web.middleware
async def guard(
    request: web.Request, handler: Callable[[web.Request], object]
) -> web.StreamResponse:
    """The proxy only ever talks to its upstream: no CONNECT, no absolute-form targets;
    aiohttp's 413 for an audited body above --max-body-bytes comes in vLLM's shape. Every
    client that makes a request must keep reading its answers (``SendWatch``)."""
    request.app[SENDS].watch(request.transport)
    if request.method == "CONNECT":
        return error_response(405, "CONNECT is not supported by this proxy")
    if not request.raw_path.startswith("/"):
        return error_response(400, "only origin-form request targets are accepted")
    try:
        return await handler(request)  # type: ignore[misc,no-any-return]
    except web.HTTPRequestEntityTooLarge as exc:
        return error_response(413, exc.text or "request body too large")


class Invocations:
    """``/invocations``: vLLM dispatches by body; so does the proxy, to the same operation's
    audited or metered path, so records and metrics match the direct endpoint."""

    def __init__(self, auditor: ScoringAuditor, metered: MeteredRelay, catalog: Catalog) -> None:
        self._auditor, self._metered, self._catalog = auditor, metered, catalog

    async def handle(self, request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()

        async def work(body: bytes) -> web.StreamResponse:
            prepared = await off_loop(prepare, body, request.path, body, self._catalog.task_of)
            if prepared.operation in SCORING_OPERATIONS:
                return await self._auditor.audit(request, body, started, prepared.operation)
            return await self._metered.relay(request, prepared, started)

        return await handle_admitted(request, work)


def _admin_routes(admin: web.Application) -> None:
    health.add_routes(admin)
    admin.router.add_get("/metrics", serve_metrics)


def create_app(
    settings: Settings,
    *,
    catalog: Catalog | None = None,
    pool: TokenizerPool | None = None,
    sinks: list[Sink] | None = None,
) -> web.Application:
    """The proxy application; tests pass their own catalog (e.g. a tokenizer loader)."""
    pool = pool or TokenizerPool(settings.tokenizer_threads)
    catalog = catalog or Catalog(settings, pool=pool)
    app = web.Application(
        client_max_size=settings.max_body_bytes,
        middlewares=[guard, attribution],
    )
    app.cleanup_ctx.append(session_context(settings))
    app.cleanup_ctx.append(catalog_context(catalog))
    app.cleanup_ctx.append(pool_context(pool))
    app.cleanup_ctx.append(meter_context(settings, sinks))
    app.cleanup_ctx.append(settler_context(settings))
    metrics = Metrics(settings)
    app[METRICS] = metrics
    app.cleanup_ctx.append(send_watch_context(settings.send_timeout))
    app[BODIES] = BodyBudget(
        settings.max_inflight_body_bytes, settings.max_body_bytes, settings.body_read_timeout
    )
    health.add_routes(app)
    if settings.admin_port is None:
        app.router.add_get("/metrics", serve_metrics)
    app.cleanup_ctx.append(admin_context(settings, _admin_routes, shared=(CATALOG, METER)))
    auditor = ScoringAuditor(settings, catalog, pool)
    metered = app[METERED] = MeteredRelay(settings.upstream_base, settings.max_answer_bytes)
    posted: dict[str, Handler] = {path: auditor.handle for path in SCORE_PATHS | RERANK_PATHS}
    posted |= {path: metered.handle for path in METERED_PATHS}
    posted[INVOCATIONS_PATH] = Invocations(auditor, metered, catalog).handle
    for path in sorted(posted):
        app.router.add_post(path, posted[path])
    relay = Relay(settings.upstream_base, settings.body_read_timeout)
    app.router.add_route("*", "/{tail:.*}", as_vllm_routes(posted, relay.handle))
    return app


def as_vllm_routes(posted: dict[str, Handler], relay: Handler) -> Handler:
    """The catch-all route: a POST whose decoded path is audited or metered goes to that
    path's handler, anything else to the relay.

    aiohttp's router matches paths with an encoded slash (``%2F``) still encoded, while
    vLLM's server (uvicorn, then Starlette) decodes it first: ``POST /v1%2Frerank`` is
    vLLM's rerank endpoint, and relayed as is it would be served with no record at all.
    The upstream still gets the request target unchanged."""

    async def handle(request: web.Request) -> web.StreamResponse:
        handler = posted.get(request.path) if request.method == "POST" else None
        return await (handler or relay)(request)

    return handle


def raise_open_files_limit() -> None:
    """Every client and upstream connection is a file descriptor: use the hard limit
    (often 1,024 soft), so connection floods meet the proxy's own bounds first."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    log.info("open_files_limit", limit=max(soft, hard))


def run(settings: Settings) -> None:
    """Serve until SIGINT/SIGTERM."""
    tune_allocator()
    configure_logging(settings.log_level)
    raise_open_files_limit()
    log.info(
        "starting",
        version=__version__,
        upstream=settings.upstream_base,
        listen=f"{settings.host}:{settings.port}",
        mode=settings.mode.value,
    )
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    main = loop.create_task(serve(settings))
    try:
        with contextlib.suppress(web.GracefulExit, KeyboardInterrupt):
            loop.run_until_complete(main)
    finally:
        # As aiohttp's run_app: first let the server's own shutdown run (drain requests,
        # finish exchanges, deliver records) while its background tasks are still alive;
        # only then cancel whatever is left.
        _cancel(loop, {main})
        _cancel(loop, asyncio.all_tasks(loop))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def _cancel(loop: asyncio.AbstractEventLoop, tasks: set[asyncio.Task[Any]]) -> None:
    pending = {t for t in tasks if not t.done()}
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))


async def serve(settings: Settings) -> None:
    """aiohttp's run_app, plus the client connection cap (which run_app cannot take)."""
    app = create_app(settings)
    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=True,
        shutdown_timeout=30,
        keepalive_timeout=settings.keepalive_timeout,  # aiohttp's handler default: 3,630 s
    )
    await runner.setup()
    assert runner.server is not None
    cap_connections(runner.server, settings.max_connections, app[METRICS])
    await web.TCPSite(runner, settings.host, settings.port).start()
    freeze = asyncio.create_task(freeze_heap(app[CATALOG]), name="freeze-heap")
    try:
        await asyncio.Event().wait()  # until SIGINT/SIGTERM (GracefulExit)
    finally:
        freeze.cancel()
        await runner.cleanup()


async def freeze_heap(catalog: Catalog) -> None:
    """Once the first discovery has loaded the tokenizers, move every object made so far
    (modules, tokenizers, validators: about 100,000) out of the cyclic garbage
    collector's reach: its full collections then walk what requests allocate, not the
    whole interpreter (each walk took about 30 ms here)."""
    await catalog.ready.wait()
    gc.collect()
    gc.freeze()


def busy_answer() -> bytes:
    """What a client beyond --max-connections gets before its connection is closed."""
    error = {
        "message": "too many connections to the proxy; retry",
        "type": "ServiceUnavailable",
        "param": None,
        "code": 503,
    }
    body = json.dumps({"error": error}).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        f"Retry-After: 1\r\nConnection: close\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def cap_connections(server: web.Server, limit: int, metrics: Metrics) -> None:
    """Refuse connections beyond ``limit`` at once (a 503 in vLLM's error shape, then
    closed), so a flood of idle or trickling connections cannot use up the process's file
    descriptors and starve everyone else."""
    admit = server.connection_made
    answer = busy_answer()

    def connection_made(handler: Any, transport: asyncio.Transport) -> None:
        if len(server.connections) >= limit:
            metrics.refused.labels("503").inc()
            log.warning("connection_refused", open=len(server.connections), limit=limit)
            transport.write(answer)
            transport.close()
            return
        admit(handler, transport)

    server.connection_made = connection_made  # type: ignore[method-assign]
