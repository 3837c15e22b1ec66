"""The supervisor's own metrics and its ``--admin-port`` (docs/workers.md, "Readiness and
the admin port", "Metrics"): the pod's ``/metrics`` is every process's values in the
multiprocess directory, summed by prometheus_client's collector; ``/readyz`` is the pod's
state; ``/upstream/metrics`` is vLLM's, read with the supervisor's own session."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
    multiprocess,
)

from proxy.serving import admin
from proxy.serving.adminrelay import add_admin_relay
from proxy.serving.startup import listen
from proxy.serving.upstream import session_context
from proxy.settings import Settings

PodReport = Callable[[], tuple[bool, dict[str, Any]]]


class PodMetrics:
    """The supervisor's counters and gauges, written to the pod's directory beside the
    workers' (so every page, a worker's or the admin port's, shows them): the supervisor
    imports this module once ``PROMETHEUS_MULTIPROC_DIR`` names ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.restarts = Counter(
            "usage_proxy_worker_restarts",
            "Workers started again after they exited unasked (crash, signal, hang).",
            ["worker"],
            registry=None,
        )
        self.ready = Gauge(
            "usage_proxy_workers_ready",
            "Workers of the pod connected to the supervisor and ready.",
            registry=None,
            multiprocess_mode="max",
        )

    def render(self) -> bytes:
        """The pod's page: every process's values combined."""
        pod = CollectorRegistry()
        multiprocess.MultiProcessCollector(pod, path=str(self.directory))  # type: ignore[no-untyped-call]
        return generate_latest(pod)

    def dead(self, pid: int) -> None:
        """A worker's ``live*`` gauges go with it; its counters stay in the sums."""
        multiprocess.mark_process_dead(pid, str(self.directory))  # type: ignore[no-untyped-call]


def admin_app(
    settings: Settings, metrics: PodMetrics, report: PodReport, admin_socket: Path
) -> web.Application:
    """The pod's ``--admin-port``; with ``--admin-tokens``, the admin API relayed to
    worker 0 on ``admin_socket`` (``adminrelay``)."""
    app = web.Application()
    app.cleanup_ctx.append(session_context(settings))

    async def readyz(request: web.Request) -> web.Response:
        ready, body = report()
        return web.json_response(body, status=200 if ready else 503)

    async def page(request: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.router.add_get("/healthz", admin.healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", page)
    app.router.add_get("/upstream/metrics", admin.upstream_metrics(app, settings.upstream_base))
    if settings.admin_tokens is not None:
        add_admin_relay(app, admin_socket)
    return app


async def serve_admin(settings: Settings, app: web.Application) -> web.AppRunner | None:
    """Listen on ``--admin-port`` when set."""
    if settings.admin_port is None:
        return None
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=settings.keepalive_timeout)
    await runner.setup()
    await listen(runner, settings.admin_host, settings.admin_port, "--admin-port")
    return runner
