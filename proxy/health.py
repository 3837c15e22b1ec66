"""Liveness and readiness, answered by the proxy itself and never forwarded upstream."""

from __future__ import annotations

from aiohttp import web

from proxy.catalog import CATALOG
from proxy.metering import METER


async def healthz(request: web.Request) -> web.Response:
    """The process is alive and its event loop answers."""
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Ready when discovery has reached the upstream, every served model can be audited,
    and records can be journaled (a load balancer then drains a pod whose disk failed)."""
    catalog = request.app[CATALOG]
    problems = {name: m.problem for name, m in catalog.models.items() if m.problem}
    journal = request.app[METER].journal
    if journal is not None and not journal.healthy and not await journal.probe():
        problems["journal"] = journal.problem or "records cannot be journaled"
    ready = catalog.ready.is_set() and not problems and bool(catalog.models)
    body = {
        "status": "ready" if ready else "not ready",
        "upstream_version": catalog.release.version,
        "models": sorted(catalog.models),
        "problems": problems,
    }
    return web.json_response(body, status=200 if ready else 503)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
