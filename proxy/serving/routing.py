"""The route table applied: one catch-all route sends each request to its handler by the
decoded path vLLM's router will match (``proxy.accounting.routes``), behind a guard."""

from __future__ import annotations

import time
from collections.abc import Mapping

import structlog
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from proxy.accounting.dispatch import prepare
from proxy.accounting.operations import SCORING_OPERATIONS, SESSION_OPERATIONS
from proxy.accounting.routes import (
    Handling,
    Route,
    route_of,
)
from proxy.serving.attribution import WHO
from proxy.serving.audited import ScoringAuditor
from proxy.serving.bodies import off_loop
from proxy.serving.catalog import Catalog
from proxy.serving.exchange import Exchange, Exchanges, Work
from proxy.serving.isolation import ResponseOwners, stored_response_id
from proxy.serving.metered import MeteredRelay
from proxy.serving.sendwatch import SendWatch
from proxy.serving.shares import TenantShares
from proxy.serving.unmetered import Unmetered
from proxy.serving.upstream import TARGET, error_response
from proxy.wire.targets import BadTarget, normalize

log = structlog.get_logger("proxy.serving.routing")


def guard(sends: SendWatch) -> Middleware:
    """The proxy only ever talks to its upstream: no CONNECT, and a target read as vLLM's
    router reads it (``proxy.wire.targets``) or refused; aiohttp's 413 for an audited body
    above --max-body-bytes comes in vLLM's shape. Every client that makes a request must
    keep reading its answers (``SendWatch``)."""

    @web.middleware
    async def guarded(request: web.Request, handler: Handler) -> web.StreamResponse:
        sends.watch(request.transport)
        if request.method == "CONNECT":
            return error_response(405, "CONNECT is not supported by this proxy")
        try:
            request[TARGET] = normalize(request.raw_path)
        except BadTarget as exc:
            return error_response(400, str(exc))
        try:
            return await handler(request)
        except web.HTTPRequestEntityTooLarge as exc:
            return error_response(413, exc.text or "request body too large")

    return guarded


# vLLM's /invocations (SageMaker) lets this header name the model instead of the body.
ADAPTER_HEADER = "X-Amzn-SageMaker-Adapter-Identifier"


class Invocations:
    """``/invocations``: vLLM dispatches by body; so does the proxy, to the same operation's
    audited or metered path, so records and metrics match the direct endpoint."""

    def __init__(self, auditor: ScoringAuditor, metered: MeteredRelay, catalog: Catalog) -> None:
        self._auditor, self._metered, self._catalog = auditor, metered, catalog

    async def __call__(self, exchange: Exchange) -> web.StreamResponse:
        body, catalog = exchange.body, self._catalog
        adapter = exchange.request.headers.get(ADAPTER_HEADER)
        from_header = catalog.release.invocations_model_from_header
        prepared = await off_loop(
            prepare, body, exchange.path, body, catalog.task_of, adapter, from_header
        )
        if prepared.ambiguous is not None:
            self._auditor.refuse_unclear()
            return error_response(400, prepared.ambiguous)
        if prepared.operation in SCORING_OPERATIONS:
            # From 0.11.1 vLLM serves the adapter header's model (or the default), not the
            # body's: so is the request counted and recorded.
            model = prepared.model
            lookup = (lambda _named: catalog.lookup(model)) if from_header else None
            return await self._auditor.audit(exchange, prepared.operation, lookup)
        return await self._metered.relay(exchange, prepared)


# The share that requests on keyless routes (probes) are counted under.
KEYLESS = "(keyless)"


class Router:
    """The catch-all route: the closed world of ``proxy.accounting.routes``.

    The route is found by the normalized path, the one vLLM serves and the one sent (a
    path with ``%2F``, dot segments or a trailing slash is the endpoint vLLM's router
    makes of it). A metered route becomes an exchange run by its handler; a free one is
    relayed; a refused or unknown one is answered here, unless the operator relays it
    unmetered (``--allow-unmetered``), which is logged and counted."""

    def __init__(
        self,
        exchanges: Exchanges,
        handlers: Mapping[Handling, Work],
        relay: Handler,
        unmetered: Unmetered,
        shares: TenantShares,
        owners: ResponseOwners,
        *,
        admin_port: bool,
        sessions: Work | None = None,
    ) -> None:
        self._exchanges = exchanges
        self._sessions = sessions
        self._owners = owners
        self._shares = shares
        self._handlers = handlers
        self._relay = relay
        self._unmetered = unmetered
        self._admin_port = admin_port

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """The request within its tenant's share of upstream connections (probes need
        no key: they share one, so keyless requests cannot hold every connection)."""
        who = request.get(WHO)
        tenant = who.tenant if who is not None else KEYLESS
        refusal = self._shares.enter(tenant)
        if refusal is not None:
            return refusal
        try:
            return await self._route(request)
        finally:
            self._shares.leave(tenant)

    async def _route(self, request: web.Request) -> web.StreamResponse:
        path = request[TARGET].path
        route = route_of(path)
        refusal = self._refusal(request.method, path, route)
        if refusal is not None:
            if not self._unmetered.allows(path):
                return refusal
            self._unmetered.relayed(path, request.method)
            return await self._relay(request)
        assert route is not None
        if route.operation in SESSION_OPERATIONS and self._sessions is not None:
            session = Exchange(request, route, b"", 0, time.perf_counter(), request[WHO])
            return await self._exchanges.run(session, self._sessions)
        work = self._handlers.get(route.handling)
        if work is None or request.method != "POST":
            response_id = stored_response_id(route, path)
            if response_id is not None:  # a stored response: its tenant's alone
                who = request.get(WHO)
                tenant = who.tenant if who is not None else KEYLESS
                refusal = await self._owners.refusal(response_id, tenant)
                if refusal is not None:
                    return refusal
            return await self._relay(request)
        return await self._exchanges.serve(request, route, work)

    def _refusal(self, method: str, path: str, route: Route | None) -> web.Response | None:
        if route is None:
            return error_response(404, f"{path} is not an endpoint this proxy serves")
        if method not in route.methods:
            return error_response(405, f"{method} is not allowed on {path}")
        if route.handling is Handling.REFUSED:
            return error_response(403, f"{path} {route.why}: refused by the proxy")
        if path == "/metrics":  # vLLM's own (per-model token totals) are never relayed
            where = "the proxy's admin port" if self._admin_port else "GET /metrics exactly"
            return error_response(404, f"the proxy's metrics are served on {where}")
        return None
