"""The OpenTelemetry GenAI token-usage metric, sent over OTLP/HTTP by the OpenTelemetry SDK
(``--otlp-metrics-endpoint``): ``gen_ai.client.token.usage``, one input and one output
measurement per usage record, with the semantic conventions' attribute names.

Imported only when an endpoint is configured (``proxy.serving.app``): without one, no
OpenTelemetry module is loaded and nothing is sent. The SDK's reader exports from its own
thread, so the event loop never waits on the collector; a collector that is down costs
log lines from the SDK, never a request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from aiohttp import web
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv._incubating.metrics.gen_ai_metrics import GEN_AI_CLIENT_TOKEN_USAGE
from opentelemetry.semconv.attributes import server_attributes as server
from yarl import URL

from proxy.accounting.operations import Operation
from proxy.ledger.records import UsageRecord
from proxy.metric_specs import TOKEN_BUCKETS
from proxy.settings import Settings

PROVIDER = "vllm"  # gen_ai.provider.name: no well-known value names vLLM
# The conventions' well-known operation names, where the proxy's operation is one of them;
# the others (score, rerank, classify, pooling, decisions, audio, ...) keep their own name.
OPERATIONS: dict[str, str] = {
    Operation.CHAT: "chat",
    Operation.MESSAGES: "chat",
    Operation.RESPONSES: "chat",
    Operation.COMPLETIONS: "text_completion",
    Operation.GENERATE: "text_completion",
    Operation.EMBEDDINGS: "embeddings",
}
CleanupContext = Callable[[web.Application], AsyncIterator[None]]


class TokenUsage:
    """A recorder subscriber: each record's billed prompt tokens as ``input`` and billed
    completion tokens as ``output`` (what the tenant pays: the engine's count where the
    proxy proved it). The tenant is no attribute: the conventions have none, and a series
    per tenant would grow every collector with the tenants (the records carry it)."""

    def __init__(self, settings: Settings) -> None:
        assert settings.otlp_metrics_endpoint is not None
        exporter = OTLPMetricExporter(endpoint=settings.otlp_metrics_endpoint, timeout=10)
        interval_ms = settings.otlp_export_interval * 1000
        reader = PeriodicExportingMetricReader(exporter, export_interval_millis=interval_ms)
        resource = Resource.create(
            {"service.name": "vllm-usage-proxy", "service.instance.id": settings.instance}
        )
        self._provider = MeterProvider(metric_readers=[reader], resource=resource)
        meter = self._provider.get_meter("vllm-usage-proxy")
        self._histogram = meter.create_histogram(
            GEN_AI_CLIENT_TOKEN_USAGE,
            unit="{token}",
            description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
        )
        upstream = URL(settings.upstream_base)
        self._server: dict[str, str | int] = {
            server.SERVER_ADDRESS: upstream.host or "",
            server.SERVER_PORT: upstream.port or 0,
        }

    def __call__(self, record: UsageRecord) -> None:
        common: dict[str, str | int] = {
            gen_ai.GEN_AI_OPERATION_NAME: OPERATIONS.get(record.operation, record.operation),
            gen_ai.GEN_AI_PROVIDER_NAME: PROVIDER,
            **self._server,
        }
        if record.model is not None:
            common[gen_ai.GEN_AI_REQUEST_MODEL] = record.model
        for kind, tokens in (
            ("input", record.prompt_tokens_billed),
            ("output", record.completion_tokens_billed),
        ):
            if tokens is not None:
                self._histogram.record(tokens, {**common, gen_ai.GEN_AI_TOKEN_TYPE: kind})

    def shutdown(self) -> None:
        """Export what is left and stop the reader's thread (blocking: run off the loop)."""
        self._provider.shutdown()


def token_usage(settings: Settings) -> tuple[TokenUsage, CleanupContext]:
    """The subscriber and the cleanup context that flushes it when the app stops."""
    usage = TokenUsage(settings)

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        yield
        await asyncio.to_thread(usage.shutdown)

    return usage, ctx
