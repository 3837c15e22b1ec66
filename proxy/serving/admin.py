"""The proxy's own endpoints, answered here and never forwarded: liveness, readiness and
its Prometheus metrics, on the main port or on ``--admin-port``; on the admin port also
the upstream's metrics (``/upstream/metrics``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CONTENT_TYPE_LATEST

from proxy.metrics import Metrics
from proxy.serving.pod import PodState
from proxy.serving.readiness import Check
from proxy.serving.startup import listen
from proxy.serving.upstream import SESSION, UpstreamError, translated
from proxy.settings import Settings


async def healthz(request: web.Request) -> web.Response:
    """The process is alive and its event loop answers."""
    return web.json_response({"status": "ok"})


def readiness(check: Check, pod: PodState | None = None) -> Handler:
    """``/readyz``: this process's check; in a pod's worker, also the pod's state as the
    supervisor last sent it (ready only when every worker is)."""

    async def readyz(request: web.Request) -> web.Response:
        ready, body = await check()
        if pod is not None:
            body["workers"] = pod.workers
            if not pod.ready:
                body["problems"]["pod"] = "not every worker of the pod is ready"
            ready = ready and pod.ready
            body["status"] = "ready" if ready else "not ready"
        return web.json_response(body, status=200 if ready else 503)

    return readyz


def metrics_page(metrics: Metrics) -> Handler:
    async def serve_metrics(request: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    return serve_metrics


def add_routes(
    app: web.Application,
    check: Check,
    metrics: Metrics | None = None,
    pod: PodState | None = None,
) -> None:
    """Health and readiness (``check``, with the pod's state in a pod's worker); the
    metrics page too when ``metrics`` is given."""
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readiness(check, pod))
    if metrics is not None:
        app.router.add_get("/metrics", metrics_page(metrics))


def upstream_metrics(app: web.Application, base: str) -> Handler:
    """vLLM's own ``/metrics``, read through the admin port: in a pod where vLLM listens
    on loopback only (so nothing can bypass the proxy), Prometheus scrapes it here."""

    async def relay(request: web.Request) -> web.Response:
        url = f"{base}/metrics"
        try:
            with translated(url):
                async with app[SESSION].get(url, allow_redirects=False) as response:
                    body = await response.read()
                    kind = response.headers.get("Content-Type", CONTENT_TYPE_LATEST)
                    return web.Response(
                        body=body, status=response.status, headers={"Content-Type": kind}
                    )
        except UpstreamError as exc:
            return exc.response()

    return relay


def admin_context(
    settings: Settings, routes: Callable[[web.Application], None]
) -> Callable[[web.Application], AsyncIterator[None]]:
    """cleanup_ctx: serve ``routes`` on ``--admin-port`` when set."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        if settings.admin_port is None:
            yield
            return
        admin = web.Application()
        routes(admin)
        admin.router.add_get("/upstream/metrics", upstream_metrics(app, settings.upstream_base))
        runner = web.AppRunner(admin, access_log=None, keepalive_timeout=settings.keepalive_timeout)
        await runner.setup()
        await listen(runner, settings.admin_host, settings.admin_port, "--admin-port")
        yield
        await runner.cleanup()

    return ctx


def task_sampler_context(
    metrics: Metrics, every: float = 5.0
) -> Callable[[web.Application], AsyncIterator[None]]:
    """cleanup_ctx of a pod's worker: its task count sampled every ``every`` seconds,
    the leak canary's value written where the pod's page reads it (one process reads
    it at each scrape instead)."""

    async def sample() -> None:
        while True:
            metrics.sample_tasks()
            await asyncio.sleep(every)

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(sample(), name="task-sampler")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    return ctx
