"""The catalogue of every metric the proxy exports: name, help, labels, buckets and, for a
gauge, how a pod's workers' values combine (docs/workers.md, "Metrics").

``proxy.metrics`` builds one registry from it; docs/operations.md lists the same names
(tests/unit/test_metrics.py holds the two together).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from proxy.accounting.units import Unit

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
# How the pod's page combines the workers' values of a gauge (prometheus_client's
# multiprocess modes; "live" ones drop a dead worker's value).
GaugeMode = Literal["max", "livemin", "livemax", "livesum", "mostrecent"]
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


@dataclass(frozen=True, slots=True)
class Spec:
    kind: type[Counter] | type[Gauge] | type[Histogram]
    name: str
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None
    unit: str = ""
    tenant: bool = False  # carries the tenant label when --metrics-tenant-label is on
    mode: GaugeMode | None = None  # a gauge's: how several workers' values combine

    def build(self, registry: CollectorRegistry | None, tenant: tuple[str, ...]) -> Any:
        labels = (*self.labels, *tenant) if self.tenant else self.labels
        extra: dict[str, Any] = {"buckets": self.buckets} if self.buckets else {}
        if self.unit:
            extra["unit"] = self.unit
        if self.mode is not None:
            extra["multiprocess_mode"] = self.mode
        return self.kind(self.name, self.help, labels, registry=registry, **extra)


# The traffic's metrics (audit, journal, reconciliation, exports), by the attribute that
# holds each; the limits' are in proxy/limit_metric_specs.py.
TRAFFIC_SPECS: dict[str, Spec] = {
    "requests": Spec(
        Counter,
        "usage_proxy_audited_requests",
        "Audited scoring responses by verdict.",
        ("endpoint", "model", "verdict"),
        tenant=True,
    ),
    "reported": Spec(
        Counter,
        "usage_proxy_reported_prompt_tokens",
        "Prompt tokens the upstream reported, every metered operation.",
        ("endpoint", "model"),
        tenant=True,
    ),
    "billed": Spec(
        Counter,
        "usage_proxy_billed_prompt_tokens",
        "Prompt tokens billed (engine-level when proven, else reported), every metered operation.",
        ("endpoint", "model"),
        tenant=True,
    ),
    "over": Spec(
        Counter,
        "usage_proxy_over_reported_prompt_tokens",
        "Prompt tokens the upstream over-reported (corrected verdicts).",
        ("endpoint", "model"),
        tenant=True,
    ),
    # Completion tokens per tenant (#39): the GenAI histogram has no tenant label.
    "reported_completion": Spec(
        Counter,
        "usage_proxy_reported_completion_tokens",
        "Completion tokens the upstream reported.",
        ("endpoint", "model"),
        tenant=True,
    ),
    "billed_completion": Spec(
        Counter,
        "usage_proxy_billed_completion_tokens",
        "Completion tokens billed.",
        ("endpoint", "model"),
        tenant=True,
    ),
    # Units beyond tokens (record schema v3), per tenant as the token counters.
    "billed_cached": Spec(
        Counter,
        f"usage_proxy_billed_{Unit.CACHED}",
        "Prompt tokens vLLM's prefix cache served, as reported (part of the billed prompt "
        "tokens, not added to them).",
        ("endpoint", "model"),
        tenant=True,
    ),
    "billed_audio": Spec(
        Counter,
        f"usage_proxy_billed_{Unit.AUDIO}",
        "Seconds of audio billed, as vLLM reported them (transcriptions, translations).",
        ("endpoint", "model"),
        tenant=True,
    ),
    "reconcile_interval": Spec(
        Gauge,
        "usage_proxy_reconcile_interval_seconds",
        "--reconcile-interval: seconds between reconciliation windows (0: reconciliation off).",
        mode="max",
    ),
    "tokenization": Spec(
        Histogram,
        "usage_proxy_accounting_seconds",
        "CPU time spent parsing and recounting a request.",
        (),
        buckets=LATENCY_BUCKETS,
    ),
    "added": Spec(
        Histogram,
        "usage_proxy_added_latency_seconds",
        "Time the proxy added on top of the upstream call (audited requests).",
        (),
        buckets=LATENCY_BUCKETS,
    ),
    "upstream_errors": Spec(
        Counter,
        "usage_proxy_upstream_errors",
        "Upstream unreachable (502) or timed out (504).",
        ("status",),
    ),
    "journal_failures": Spec(
        Counter, "usage_proxy_journal_failures", "Usage records that could not be journaled.", ()
    ),
    "journal_ready": Spec(
        Gauge,
        "usage_proxy_journal_ready",
        "1 while records can be journaled, 0 while writes fail or stall (alarm on 0).",
        (),
        mode="livemin",
    ),
    "journal_replaced": Spec(
        Counter,
        "usage_proxy_journal_replaced",
        "Times the journal file was found deleted or replaced and was recreated.",
        (),
    ),
    "refused": Spec(
        Counter,
        "usage_proxy_refused_requests",
        "Requests refused before forwarding (401 no/unknown key; 400 a bad tenant header, "
        "or a body naming the inputs of two requests).",
        ("status",),
    ),
    "invalid_usage": Spec(
        Counter,
        "usage_proxy_invalid_usage",
        "Successful answers whose usage is not a valid token count (billed nothing).",
        ("endpoint",),
    ),
    "shortcuts_trusted": Spec(
        Gauge,
        "usage_proxy_shortcuts_trusted",
        "1 once full recounts of the model proved the proxy reads it right (derivation and "
        "formula verdicts allowed), 0 while proving or after a full recount disagreed.",
        ("model",),
        mode="livemin",
    ),
    "recount_disagreements": Spec(
        Counter,
        "usage_proxy_recount_disagreements",
        "Models a full recount disproved (mismatch): shortcuts are off for them from then on.",
        ("model",),
    ),
    "aborted": Spec(
        Counter,
        "usage_proxy_client_aborted",
        "Metered exchanges the client hung up on before the end (still recorded).",
        ("endpoint",),
    ),
    "stalled_clients": Spec(
        Counter,
        "usage_proxy_stalled_clients",
        "Client connections closed for accepting no answer byte for --send-timeout.",
        (),
    ),
    "unmetered": Spec(
        Counter,
        "usage_proxy_unmetered_requests",
        "Requests relayed without a usage record because --allow-unmetered names them.",
        ("route",),
    ),
    "keys_loaded": Spec(
        Gauge,
        "usage_proxy_keys_loaded",
        "API keys in the key map in use (--api-keys).",
        mode="livemax",
    ),
    "keys_loaded_at": Spec(
        Gauge,
        "usage_proxy_keys_loaded_timestamp_seconds",
        "When the key map in use was loaded (Unix time).",
        mode="livemin",
    ),
    "keys_reload_failures": Spec(
        Counter,
        "usage_proxy_keys_reload_failures",
        "Changed --api-keys files that could not be loaded (the previous map stays in use).",
    ),
    "engine_prompt": Spec(
        Counter,
        "usage_proxy_engine_prompt_tokens",
        "Growth of the upstream's vllm:prompt_tokens_total observed since start.",
        (),
    ),
    "unbilled_prompt": Spec(
        Counter,
        "usage_proxy_unbilled_prompt_tokens",
        "Engine prompt tokens in settled windows that no record accounts for.",
        (),
    ),
    "overbilled_prompt": Spec(
        Counter,
        "usage_proxy_overbilled_prompt_tokens",
        "Billed prompt tokens in settled windows beyond what the engine processed.",
        (),
    ),
    "engine_completion": Spec(
        Counter,
        "usage_proxy_engine_completion_tokens",
        "Growth of the upstream's vllm:generation_tokens_total observed since start.",
        (),
    ),
    "unbilled_completion": Spec(
        Counter,
        "usage_proxy_unbilled_completion_tokens",
        "Engine generation tokens in settled windows that no record accounts for.",
        (),
    ),
    "overbilled_completion": Spec(
        Counter,
        "usage_proxy_overbilled_completion_tokens",
        "Billed completion tokens in settled windows beyond what the engine generated.",
        (),
    ),
    "unbilled_in_seconds": Spec(
        Counter,
        "usage_proxy_unbilled_in_seconds_tokens",
        "Engine tokens no record accounts for in settled windows with whole transcriptions "
        "(billed in seconds of audio, their tokens counted by the engine): not drift, so "
        "kept out of the unbilled counters; kind prompt or completion.",
        ("kind",),
    ),
    "windows": Spec(
        Counter,
        "usage_proxy_reconcile_windows",
        "Reconciliation windows closed, by status (settled, counter_reset).",
        ("status",),
    ),
    "last_settled": Spec(
        Gauge,
        "usage_proxy_reconcile_last_settled_timestamp_seconds",
        "End of the last closed reconciliation window (Unix time).",
        (),
        mode="max",
    ),
    "dead_records": Spec(
        Gauge,
        "usage_proxy_export_dead_records",
        "Records a sink rejected permanently, kept in the dead-letter store.",
        ("sink",),
        mode="livesum",
    ),
    "exported": Spec(
        Counter, "usage_proxy_export_delivered_records", "Records delivered, by sink.", ("sink",)
    ),
    "export_failures": Spec(
        Counter, "usage_proxy_export_failures", "Failed delivery attempts, by sink.", ("sink",)
    ),
    "backlog": Spec(
        Gauge,
        "usage_proxy_export_backlog_records",
        "Journaled records a sink has not acknowledged (adopted shards' included).",
        ("sink",),
        mode="livesum",
    ),
    "tasks": Spec(
        Gauge,
        "usage_proxy_event_loop_tasks",
        "Tasks alive on the event loop (leak canary).",
        (),
        mode="livemax",
    ),
    "genai": Spec(
        Histogram,
        "gen_ai_client_token_usage",
        "Tokens per request (OpenTelemetry GenAI semantics).",
        ("gen_ai_operation_name", "gen_ai_token_type", "gen_ai_request_model"),
        buckets=TOKEN_BUCKETS,
        unit="token",
    ),
}
