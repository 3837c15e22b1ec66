"""The tenant's usage API, on the main port, answered by the proxy itself (no engine work,
no usage record): where the tenant stands against its limits, its usage over a range, and
one of its own records by id. Only a request attributed by its API key is answered (401,
as vLLM answers a missing key, otherwise), and only about its own tenant: another
tenant's record id is answered as an unknown one (404), so nothing leaks by existence.

Its paths are under ``/usage-proxy/``, which no vLLM release serves (a test holds them
against every release's routes): the route table never relays them."""

from __future__ import annotations

from aiohttp import web

from proxy.limits.limiter import StandingUnknown
from proxy.serving.attribution import WHO
from proxy.serving.upstream import error_response, unauthorized
from proxy.serving.usage_answers import BadRange, Figures
from proxy.serving.usage_openapi import OPENAPI, RECORD, STANDING, USAGE, document


def tenant_of(request: web.Request) -> str | None:
    """The tenant whose own key made the request (None: no key of the key map)."""
    who = request.get(WHO)  # the attribution middleware's
    if who is None or not who.from_key_map or who.key_hash is None:
        return None
    return str(who.tenant)


class UsageApi:
    """The tenant's questions, answered from ``figures``."""

    def __init__(self, figures: Figures) -> None:
        self._figures = figures

    async def standing(self, request: web.Request) -> web.Response:
        tenant = tenant_of(request)
        if tenant is None:
            return unauthorized()
        try:
            return web.json_response(await self._figures.standing(tenant))
        except StandingUnknown as exc:
            return error_response(503, f"the standing cannot be read now: {exc}")

    async def usage(self, request: web.Request) -> web.Response:
        tenant = tenant_of(request)
        if tenant is None:
            return unauthorized()
        query = request.query
        try:
            since, until = self._figures.bounds(query.get("since"), query.get("until"))
        except BadRange as exc:
            return error_response(400, str(exc), param="since/until")
        return web.json_response(await self._figures.usage(tenant, since, until))

    async def record(self, request: web.Request) -> web.Response:
        tenant = tenant_of(request)
        if tenant is None:
            return unauthorized()
        record_id = request.match_info["record_id"]
        found = await self._figures.record(tenant, record_id)
        if found is None:
            return error_response(404, f"no usage record {record_id}")
        return web.json_response(found)

    async def openapi(self, request: web.Request) -> web.Response:
        if tenant_of(request) is None:
            return unauthorized()
        return web.json_response(document("tenant"))


def add_usage_routes(app: web.Application, figures: Figures) -> None:
    """The tenant's usage API on the main application (ahead of the catch-all route)."""
    api = UsageApi(figures)
    app.router.add_get(STANDING, api.standing, allow_head=False)
    app.router.add_get(USAGE, api.usage, allow_head=False)
    app.router.add_get(RECORD, api.record, allow_head=False)
    app.router.add_get(OPENAPI, api.openapi, allow_head=False)
