"""Prometheus metrics (prometheus_client), including the OpenTelemetry GenAI token histogram.

One registry per application. Tenant is a label only when enabled, and then capped: tenants
past ``--metrics-max-tenants`` are folded into ``other``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from proxy.settings import Settings
from proxy.upstream import UpstreamError

OTHER = "other"
# OpenTelemetry GenAI semantic conventions: gen_ai.client.token.usage bucket boundaries.
TOKEN_BUCKETS = (
    1,
    4,
    16,
    64,
    256,
    1024,
    4096,
    16384,
    65536,
    262144,
    1048576,
    4194304,
    16777216,
    67108864,
)
LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
)


class Metrics:
    def __init__(self, settings: Settings) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._tenants = settings.metrics_tenant_label
        self._max_tenants = settings.metrics_max_tenants
        self._seen: set[str] = set()
        # Tenants from the API-key map are a known, bounded set: never folded into 'other'.
        self.trusted_tenants: frozenset[str] = frozenset()
        # Labelled series already looked up, by label values (as bounded as the series).
        self._children: dict[tuple[str, ...], tuple[Any, Any, Any, Any]] = {}
        self._genai_children: dict[tuple[str, str, str], Any] = {}
        tenant = ("tenant",) if self._tenants else ()
        r = self.registry
        self.requests = Counter(
            "usage_proxy_audited_requests",
            "Audited scoring responses by verdict.",
            ("endpoint", "model", "verdict", *tenant),
            registry=r,
        )
        self.reported = Counter(
            "usage_proxy_reported_prompt_tokens",
            "Prompt tokens the upstream reported.",
            ("endpoint", "model", *tenant),
            registry=r,
        )
        self.billed = Counter(
            "usage_proxy_billed_prompt_tokens",
            "Prompt tokens billed (engine-level when proven, else reported).",
            ("endpoint", "model", *tenant),
            registry=r,
        )
        self.over = Counter(
            "usage_proxy_over_reported_prompt_tokens",
            "Prompt tokens the upstream over-reported (corrected verdicts).",
            ("endpoint", "model", *tenant),
            registry=r,
        )
        self.tokenization = Histogram(
            "usage_proxy_accounting_seconds",
            "CPU time spent parsing and recounting a request.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.added = Histogram(
            "usage_proxy_added_latency_seconds",
            "Time the proxy added on top of the upstream call (audited requests).",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.upstream_errors = Counter(
            "usage_proxy_upstream_errors",
            "Upstream unreachable (502) or timed out (504).",
            ("status",),
            registry=r,
        )
        self.journal_failures = Counter(
            "usage_proxy_journal_failures", "Usage records that could not be journaled.", registry=r
        )
        self.journal_ready = Gauge(
            "usage_proxy_journal_ready",
            "1 while records can be journaled, 0 while writes fail or stall (alarm on 0).",
            registry=r,
        )
        self.journal_ready.set(1)  # the journal's own health once metering starts
        self.journal_replaced = Counter(
            "usage_proxy_journal_replaced",
            "Times the journal file was found deleted or replaced and was recreated.",
            registry=r,
        )
        self.refused = Counter(
            "usage_proxy_refused_requests",
            "Requests refused before forwarding (401 no/unknown key, 400 bad tenant header).",
            ("status",),
            registry=r,
        )
        self.invalid_usage = Counter(
            "usage_proxy_invalid_usage",
            "Successful answers whose usage is not a valid token count (billed nothing).",
            ("endpoint",),
            registry=r,
        )
        self.aborted = Counter(
            "usage_proxy_client_aborted",
            "Metered exchanges the client hung up on before the end (still recorded).",
            ("endpoint",),
            registry=r,
        )
        self.stalled_clients = Counter(
            "usage_proxy_stalled_clients",
            "Client connections closed for accepting no answer byte for --send-timeout.",
            registry=r,
        )
        self.engine_prompt = Counter(
            "usage_proxy_engine_prompt_tokens",
            "Growth of the upstream's vllm:prompt_tokens_total observed since start.",
            registry=r,
        )
        self.unbilled_prompt = Counter(
            "usage_proxy_unbilled_prompt_tokens",
            "Engine prompt tokens in settled windows that no record accounts for.",
            registry=r,
        )
        self.overbilled_prompt = Counter(
            "usage_proxy_overbilled_prompt_tokens",
            "Billed prompt tokens in settled windows beyond what the engine processed.",
            registry=r,
        )
        self.engine_completion = Counter(
            "usage_proxy_engine_completion_tokens",
            "Growth of the upstream's vllm:generation_tokens_total observed since start.",
            registry=r,
        )
        self.unbilled_completion = Counter(
            "usage_proxy_unbilled_completion_tokens",
            "Engine generation tokens in settled windows that no record accounts for.",
            registry=r,
        )
        self.overbilled_completion = Counter(
            "usage_proxy_overbilled_completion_tokens",
            "Billed completion tokens in settled windows beyond what the engine generated.",
            registry=r,
        )
        self.windows = Counter(
            "usage_proxy_reconcile_windows",
            "Reconciliation windows closed, by status (settled, counter_reset).",
            ("status",),
            registry=r,
        )
        self.last_settled = Gauge(
            "usage_proxy_reconcile_last_settled_timestamp_seconds",
            "End of the last closed reconciliation window (Unix time).",
            registry=r,
        )
        self.dead_records = Gauge(
            "usage_proxy_export_dead_records",
            "Records a sink rejected permanently, kept in the dead-letter store.",
            ("sink",),
            registry=r,
        )
        self.exported = Counter(
            "usage_proxy_export_delivered_records",
            "Records delivered, by sink.",
            ("sink",),
            registry=r,
        )
        self.export_failures = Counter(
            "usage_proxy_export_failures",
            "Failed delivery attempts, by sink.",
            ("sink",),
            registry=r,
        )
        self.backlog = Gauge(
            "usage_proxy_export_backlog_records",
            "Journaled records a sink has not acknowledged.",
            ("sink",),
            registry=r,
        )
        self.tasks = Gauge(
            "usage_proxy_event_loop_tasks",
            "Tasks alive on the event loop (leak canary).",
            registry=r,
        )
        self.tasks.set_function(_task_count)
        self.genai = Histogram(
            "gen_ai_client_token_usage",
            "Tokens per request (OpenTelemetry GenAI semantics).",
            ("gen_ai_operation_name", "gen_ai_token_type", "gen_ai_request_model"),
            buckets=TOKEN_BUCKETS,
            unit="token",
            registry=r,
        )

    def tenant(self, name: str) -> tuple[str, ...]:
        """The tenant label values, capped for cardinality (empty when disabled)."""
        if not self._tenants:
            return ()
        if name in self._seen or name in self.trusted_tenants:
            return (name,)
        if len(self._seen) < self._max_tenants:
            self._seen.add(name)
            return (name,)
        return (OTHER,)

    def audited(
        self,
        endpoint: str,
        model: str,
        verdict: str,
        tenant: str,
        reported: int | None,
        billed: int | None,
        over: int,
    ) -> None:
        requests, reported_c, billed_c, over_c = self._audit_children(
            endpoint, model, verdict, self.tenant(tenant)
        )
        requests.inc()
        if reported is not None:
            reported_c.inc(reported)
        if billed is not None:
            billed_c.inc(billed)
        if over:
            over_c.inc(over)

    def _audit_children(
        self, endpoint: str, model: str, verdict: str, tenant: tuple[str, ...]
    ) -> tuple[Any, Any, Any, Any]:
        """The four labelled series of one audited request, looked up once per label set
        (``labels()`` validates and locks on every call; label sets are few and capped)."""
        key = (endpoint, model, verdict, *tenant)
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = (
                self.requests.labels(endpoint, model, verdict, *tenant),
                self.reported.labels(endpoint, model, *tenant),
                self.billed.labels(endpoint, model, *tenant),
                self.over.labels(endpoint, model, *tenant),
            )
        return children

    def token_usage(
        self, operation: str, model: str, prompt: int | None, completion: int | None
    ) -> None:
        if prompt is not None:
            self._genai(operation, "input", model).observe(prompt)
        if completion:
            self._genai(operation, "output", model).observe(completion)

    def _genai(self, operation: str, kind: str, model: str) -> Any:
        key = (operation, kind, model)
        child = self._genai_children.get(key)
        if child is None:
            child = self._genai_children[key] = self.genai.labels(operation, kind, model)
        return child

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _task_count() -> float:
    try:
        return float(len(asyncio.all_tasks()))
    except RuntimeError:  # scraped outside a running loop
        return 0.0


METRICS = web.AppKey("metrics", Metrics)


def upstream_failure(request: web.Request, exc: UpstreamError) -> web.Response:
    """Count a 502/504 the proxy produced, and return its vLLM-shaped answer."""
    request.app[METRICS].upstream_errors.labels(str(exc.status)).inc()
    return exc.response()


async def serve_metrics(request: web.Request) -> web.Response:
    body = request.app[METRICS].render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def admin_context(
    settings: Settings,
    routes: Callable[[web.Application], None],
    shared: tuple[web.AppKey[Any], ...] = (),
) -> Callable[[web.Application], AsyncIterator[None]]:
    """cleanup_ctx: serve /metrics, /healthz and /readyz on ``--admin-port`` when set,
    with the main application's ``shared`` state."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        if settings.admin_port is None:
            yield
            return
        admin = web.Application()
        admin[METRICS] = app[METRICS]
        for key in shared:
            admin[key] = app[key]
        routes(admin)
        runner = web.AppRunner(admin, access_log=None, keepalive_timeout=settings.keepalive_timeout)
        await runner.setup()
        await web.TCPSite(runner, settings.admin_host, settings.admin_port).start()
        yield
        await runner.cleanup()

    return ctx
