"""The route table applied: one catch-all route sends each request to its handler by the
decoded path vLLM's router will match (``proxy.accounting.routes``), behind a guard."""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from proxy.accounting.dispatch import prepare
from proxy.accounting.routes import BY_PATH, SCORING_OPERATIONS, Handling
from proxy.serving.audited import ScoringAuditor
from proxy.serving.bodies import off_loop
from proxy.serving.catalog import Catalog
from proxy.serving.exchange import Exchange, Exchanges, Work
from proxy.serving.metered import MeteredRelay
from proxy.serving.sendwatch import SendWatch
from proxy.serving.upstream import error_response


def guard(sends: SendWatch) -> Middleware:
    """The proxy only ever talks to its upstream: no CONNECT, no absolute-form targets;
    aiohttp's 413 for an audited body above --max-body-bytes comes in vLLM's shape. Every
    client that makes a request must keep reading its answers (``SendWatch``)."""

    @web.middleware
    async def guarded(request: web.Request, handler: Handler) -> web.StreamResponse:
        sends.watch(request.transport)
        if request.method == "CONNECT":
            return error_response(405, "CONNECT is not supported by this proxy")
        if not request.raw_path.startswith("/"):
            return error_response(400, "only origin-form request targets are accepted")
        try:
            return await handler(request)
        except web.HTTPRequestEntityTooLarge as exc:
            return error_response(413, exc.text or "request body too large")

    return guarded


class Invocations:
    """``/invocations``: vLLM dispatches by body; so does the proxy, to the same operation's
    audited or metered path, so records and metrics match the direct endpoint."""

    def __init__(self, auditor: ScoringAuditor, metered: MeteredRelay, catalog: Catalog) -> None:
        self._auditor, self._metered, self._catalog = auditor, metered, catalog

    async def __call__(self, exchange: Exchange) -> web.StreamResponse:
        body = exchange.body
        prepared = await off_loop(prepare, body, exchange.path, body, self._catalog.task_of)
        if prepared.operation in SCORING_OPERATIONS:
            return await self._auditor.audit(exchange, prepared.operation)
        return await self._metered.relay(exchange, prepared)


def router(exchanges: Exchanges, handlers: Mapping[Handling, Work], relay: Handler) -> Handler:
    """The catch-all route: a POST to a metered route becomes an exchange run by its
    handler; anything else goes to the relay.

    aiohttp's router matches paths with an encoded slash (``%2F``) still encoded, while
    vLLM's server (uvicorn, then Starlette) decodes it first: ``POST /v1%2Frerank`` is
    vLLM's rerank endpoint, so the route is looked up by the decoded path. The upstream
    still gets the request target unchanged."""

    async def handle(request: web.Request) -> web.StreamResponse:
        route = BY_PATH.get(request.path) if request.method == "POST" else None
        work = handlers.get(route.handling) if route is not None else None
        if route is None or work is None:
            return await relay(request)
        return await exchanges.serve(request, route, work)

    return handle
