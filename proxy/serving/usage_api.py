"""The tenant's usage API, on the main port, answered by the proxy itself (no engine work,
no usage record): where the tenant stands against its limits, its usage over a range, and
one of its own records by id. Only a request attributed by its API key is answered (401,
as vLLM answers a missing key, otherwise), and only about its own tenant: another
tenant's record id is answered as an unknown one (404), so nothing leaks by existence.

A tenant's questions are answered one at a time (``Turns``): the same question asked
again meanwhile shares the answer being read, another one is answered 429; so one tenant
holds at most one reading process, and a tenant asking in a loop never queues the others.

Its paths are under ``/usage-proxy/``, which no vLLM release serves (a test holds them
against every release's routes): the route table never relays them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from typing import Any, TypeVar

from aiohttp import web

from proxy.ledger.questions import ReadFailed
from proxy.limits.limiter import StandingUnknown
from proxy.serving.attribution import WHO
from proxy.serving.upstream import error_response, unauthorized
from proxy.serving.usage_answers import BadRange, Figures
from proxy.serving.usage_openapi import OPENAPI, RECORD, STANDING, USAGE, document

T = TypeVar("T")
RETRY_SECONDS = 1


def tenant_of(request: web.Request) -> str | None:
    """The tenant whose own key made the request (None: no key of the key map)."""
    who = request.get(WHO)  # the attribution middleware's
    if who is None or not who.from_key_map or who.key_hash is None:
        return None
    return str(who.tenant)


class Busy(Exception):
    """Another question of the tenant is being answered."""


class Turns:
    """Each tenant's question being answered, at most one: an identical question shares
    it (single flight), another is refused (``Busy``)."""

    def __init__(self) -> None:
        self._asking: dict[str, tuple[Hashable, asyncio.Task[Any]]] = {}

    async def ask(self, tenant: str, question: Hashable, answer: Callable[[], Awaitable[T]]) -> T:
        asking = self._asking.get(tenant)
        if asking is None or asking[1].done():
            task: asyncio.Task[T] = asyncio.ensure_future(answer())
            self._asking[tenant] = asking = (question, task)
            task.add_done_callback(lambda done: self._answered(tenant, done))
        elif asking[0] != question:
            raise Busy
        # shielded: a client that leaves cancels neither the read nor the others' wait
        return await asyncio.shield(asking[1])

    def _answered(self, tenant: str, task: asyncio.Task[Any]) -> None:
        if not task.cancelled():
            task.exception()  # said to whoever waited; none may have (they left)
        if tenant in self._asking and self._asking[tenant][1] is task:
            del self._asking[tenant]

    def cancel(self) -> None:
        """At shutdown: the questions being answered end."""
        for _, task in self._asking.values():
            task.cancel()


def busy() -> web.Response:
    """429 in vLLM's shape: the tenant has a question being answered."""
    response = error_response(
        429, "another usage question of this tenant is being answered; ask again after it"
    )
    response.headers["retry-after"] = str(RETRY_SECONDS)
    return response


class UsageApi:
    """The tenant's questions, answered from ``figures``, one at a time per tenant."""

    def __init__(self, figures: Figures) -> None:
        self._figures = figures
        self.turns = Turns()

    async def standing(self, request: web.Request) -> web.Response:
        tenant = tenant_of(request)
        if tenant is None:
            return unauthorized()
        try:
            found = await self.turns.ask(
                tenant, ("standing",), lambda: self._figures.standing(tenant)
            )
        except Busy:
            return busy()
        except StandingUnknown as exc:
            return error_response(503, f"the standing cannot be read now: {exc}")
        return web.json_response(found)

    async def usage(self, request: web.Request) -> web.Response:
        tenant = tenant_of(request)
        if tenant is None:
            return unauthorized()
        query = request.query
        try:
            since, until = self._figures.bounds(query.get("since"), query.get("until"))
            found = await self.turns.ask(
                tenant, ("usage", since, until), lambda: self._figures.usage(tenant, since, until)
            )
        except BadRange as exc:
            return error_response(400, str(exc), param="since/until")
        except Busy:
            return busy()
        except ReadFailed as exc:
            return error_response(503, str(exc))
        return web.json_response(found)

    async def record(self, request: web.Request) -> web.Response:
        tenant = tenant_of(request)
        if tenant is None:
            return unauthorized()
        record_id = request.match_info["record_id"]
        try:
            found = await self.turns.ask(
                tenant, ("record", record_id), lambda: self._figures.record(tenant, record_id)
            )
        except Busy:
            return busy()
        except ReadFailed as exc:
            return error_response(503, str(exc))
        if found is None:
            return error_response(404, f"no usage record {record_id}")
        return web.json_response(found)

    async def openapi(self, request: web.Request) -> web.Response:
        if tenant_of(request) is None:
            return unauthorized()
        return web.json_response(document("tenant"))


def usage_context(api: UsageApi, figures: Figures) -> Callable[[web.Application], Any]:
    """cleanup_ctx: at shutdown the questions being answered end, then the readers."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        yield
        api.turns.cancel()
        with contextlib.suppress(Exception):
            figures.readers.close()

    return ctx


def add_usage_routes(app: web.Application, figures: Figures) -> None:
    """The tenant's usage API on the main application (ahead of the catch-all route)."""
    api = UsageApi(figures)
    app.cleanup_ctx.append(usage_context(api, figures))
    app.router.add_get(STANDING, api.standing, allow_head=False)
    app.router.add_get(USAGE, api.usage, allow_head=False)
    app.router.add_get(RECORD, api.record, allow_head=False)
    app.router.add_get(OPENAPI, api.openapi, allow_head=False)
