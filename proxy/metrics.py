"""Prometheus metrics (prometheus_client), including the OpenTelemetry GenAI token histogram.

One registry per application. Tenant is a label only when enabled, and then capped: tenants
past ``--metrics-max-tenants`` are folded into ``other``.

The workers of one pod (``serve --workers N``) write their values to one directory
(prometheus_client's multiprocess mode, chosen at import by ``PROMETHEUS_MULTIPROC_DIR``)
and each renders the pod's page from it: counters summed, each gauge by its spec's
``mode`` (docs/workers.md, "Metrics").
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

from proxy.accounting.units import Unit
from proxy.accounting.verdicts import Audit
from proxy.settings import Settings

OTHER = "other"
UNKNOWN = "unknown"
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
class _Spec:
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


# Every metric the proxy exports, by the attribute that holds it.
SPECS: dict[str, _Spec] = {
    "requests": _Spec(
        Counter,
        "usage_proxy_audited_requests",
        "Audited scoring responses by verdict.",
        ("endpoint", "model", "verdict"),
        tenant=True,
    ),
    "reported": _Spec(
        Counter,
        "usage_proxy_reported_prompt_tokens",
        "Prompt tokens the upstream reported, every metered operation.",
        ("endpoint", "model"),
        tenant=True,
    ),
    "billed": _Spec(
        Counter,
        "usage_proxy_billed_prompt_tokens",
        "Prompt tokens billed (engine-level when proven, else reported), every metered operation.",
        ("endpoint", "model"),
        tenant=True,
    ),
    "over": _Spec(
        Counter,
        "usage_proxy_over_reported_prompt_tokens",
        "Prompt tokens the upstream over-reported (corrected verdicts).",
        ("endpoint", "model"),
        tenant=True,
    ),
    # Completion tokens per tenant (#39): the GenAI histogram has no tenant label.
    "reported_completion": _Spec(
        Counter,
        "usage_proxy_reported_completion_tokens",
        "Completion tokens the upstream reported.",
        ("endpoint", "model"),
        tenant=True,
    ),
    "billed_completion": _Spec(
        Counter,
        "usage_proxy_billed_completion_tokens",
        "Completion tokens billed.",
        ("endpoint", "model"),
        tenant=True,
    ),
    # Units beyond tokens (record schema v3), per tenant as the token counters.
    "billed_cached": _Spec(
        Counter,
        f"usage_proxy_billed_{Unit.CACHED}",
        "Prompt tokens vLLM's prefix cache served, as reported (part of the billed prompt "
        "tokens, not added to them).",
        ("endpoint", "model"),
        tenant=True,
    ),
    "billed_audio": _Spec(
        Counter,
        f"usage_proxy_billed_{Unit.AUDIO}",
        "Seconds of audio billed, as vLLM reported them (transcriptions, translations).",
        ("endpoint", "model"),
        tenant=True,
    ),
    "reconcile_interval": _Spec(
        Gauge,
        "usage_proxy_reconcile_interval_seconds",
        "--reconcile-interval: seconds between reconciliation windows (0: reconciliation off).",
        mode="max",
    ),
    "tokenization": _Spec(
        Histogram,
        "usage_proxy_accounting_seconds",
        "CPU time spent parsing and recounting a request.",
        (),
        buckets=LATENCY_BUCKETS,
    ),
    "added": _Spec(
        Histogram,
        "usage_proxy_added_latency_seconds",
        "Time the proxy added on top of the upstream call (audited requests).",
        (),
        buckets=LATENCY_BUCKETS,
    ),
    "upstream_errors": _Spec(
        Counter,
        "usage_proxy_upstream_errors",
        "Upstream unreachable (502) or timed out (504).",
        ("status",),
    ),
    "journal_failures": _Spec(
        Counter, "usage_proxy_journal_failures", "Usage records that could not be journaled.", ()
    ),
    "journal_ready": _Spec(
        Gauge,
        "usage_proxy_journal_ready",
        "1 while records can be journaled, 0 while writes fail or stall (alarm on 0).",
        (),
        mode="livemin",
    ),
    "journal_replaced": _Spec(
        Counter,
        "usage_proxy_journal_replaced",
        "Times the journal file was found deleted or replaced and was recreated.",
        (),
    ),
    "refused": _Spec(
        Counter,
        "usage_proxy_refused_requests",
        "Requests refused before forwarding (401 no/unknown key; 400 a bad tenant header, "
        "or a body naming the inputs of two requests).",
        ("status",),
    ),
    "invalid_usage": _Spec(
        Counter,
        "usage_proxy_invalid_usage",
        "Successful answers whose usage is not a valid token count (billed nothing).",
        ("endpoint",),
    ),
    "shortcuts_trusted": _Spec(
        Gauge,
        "usage_proxy_shortcuts_trusted",
        "1 once full recounts of the model proved the proxy reads it right (derivation and "
        "formula verdicts allowed), 0 while proving or after a full recount disagreed.",
        ("model",),
        mode="livemin",
    ),
    "recount_disagreements": _Spec(
        Counter,
        "usage_proxy_recount_disagreements",
        "Models a full recount disproved (mismatch): shortcuts are off for them from then on.",
        ("model",),
    ),
    "aborted": _Spec(
        Counter,
        "usage_proxy_client_aborted",
        "Metered exchanges the client hung up on before the end (still recorded).",
        ("endpoint",),
    ),
    "stalled_clients": _Spec(
        Counter,
        "usage_proxy_stalled_clients",
        "Client connections closed for accepting no answer byte for --send-timeout.",
        (),
    ),
    "unmetered": _Spec(
        Counter,
        "usage_proxy_unmetered_requests",
        "Requests relayed without a usage record because --allow-unmetered names them.",
        ("route",),
    ),
    "keys_loaded": _Spec(
        Gauge,
        "usage_proxy_keys_loaded",
        "API keys in the key map in use (--api-keys).",
        mode="livemax",
    ),
    "keys_loaded_at": _Spec(
        Gauge,
        "usage_proxy_keys_loaded_timestamp_seconds",
        "When the key map in use was loaded (Unix time).",
        mode="livemin",
    ),
    "keys_reload_failures": _Spec(
        Counter,
        "usage_proxy_keys_reload_failures",
        "Changed --api-keys files that could not be loaded (the previous map stays in use).",
    ),
    "engine_prompt": _Spec(
        Counter,
        "usage_proxy_engine_prompt_tokens",
        "Growth of the upstream's vllm:prompt_tokens_total observed since start.",
        (),
    ),
    "unbilled_prompt": _Spec(
        Counter,
        "usage_proxy_unbilled_prompt_tokens",
        "Engine prompt tokens in settled windows that no record accounts for.",
        (),
    ),
    "overbilled_prompt": _Spec(
        Counter,
        "usage_proxy_overbilled_prompt_tokens",
        "Billed prompt tokens in settled windows beyond what the engine processed.",
        (),
    ),
    "engine_completion": _Spec(
        Counter,
        "usage_proxy_engine_completion_tokens",
        "Growth of the upstream's vllm:generation_tokens_total observed since start.",
        (),
    ),
    "unbilled_completion": _Spec(
        Counter,
        "usage_proxy_unbilled_completion_tokens",
        "Engine generation tokens in settled windows that no record accounts for.",
        (),
    ),
    "overbilled_completion": _Spec(
        Counter,
        "usage_proxy_overbilled_completion_tokens",
        "Billed completion tokens in settled windows beyond what the engine generated.",
        (),
    ),
    "unbilled_in_seconds": _Spec(
        Counter,
        "usage_proxy_unbilled_in_seconds_tokens",
        "Engine tokens no record accounts for in settled windows with whole transcriptions "
        "(billed in seconds of audio, their tokens counted by the engine): not drift, so "
        "kept out of the unbilled counters; kind prompt or completion.",
        ("kind",),
    ),
    "windows": _Spec(
        Counter,
        "usage_proxy_reconcile_windows",
        "Reconciliation windows closed, by status (settled, counter_reset).",
        ("status",),
    ),
    "last_settled": _Spec(
        Gauge,
        "usage_proxy_reconcile_last_settled_timestamp_seconds",
        "End of the last closed reconciliation window (Unix time).",
        (),
        mode="max",
    ),
    "dead_records": _Spec(
        Gauge,
        "usage_proxy_export_dead_records",
        "Records a sink rejected permanently, kept in the dead-letter store.",
        ("sink",),
        mode="livesum",
    ),
    "exported": _Spec(
        Counter, "usage_proxy_export_delivered_records", "Records delivered, by sink.", ("sink",)
    ),
    "export_failures": _Spec(
        Counter, "usage_proxy_export_failures", "Failed delivery attempts, by sink.", ("sink",)
    ),
    "backlog": _Spec(
        Gauge,
        "usage_proxy_export_backlog_records",
        "Journaled records a sink has not acknowledged.",
        ("sink",),
        mode="livesum",
    ),
    "tasks": _Spec(
        Gauge,
        "usage_proxy_event_loop_tasks",
        "Tasks alive on the event loop (leak canary).",
        (),
        mode="livemax",
    ),
    "genai": _Spec(
        Histogram,
        "gen_ai_client_token_usage",
        "Tokens per request (OpenTelemetry GenAI semantics).",
        ("gen_ai_operation_name", "gen_ai_token_type", "gen_ai_request_model"),
        buckets=TOKEN_BUCKETS,
        unit="token",
    ),
    # Budgets and rate limits (--limits, proxy.limits).
    "limited": _Spec(
        Counter,
        "usage_proxy_limited_requests",
        "Requests refused by a limit (429, or 400 when the cost alone exceeds it), by limit.",
        ("limit",),
        tenant=True,
    ),
    "prompt_counts": _Spec(
        Counter,
        "usage_proxy_prompt_counts",
        "Generation prompts priced before forwarding, by how: counted by the upstream's "
        "/tokenize, or the byte bound (not_countable, too_many, refused, timeout, "
        "unreachable, invalid).",
        ("outcome",),
    ),
    "budget_remaining": _Spec(
        Gauge,
        "usage_proxy_budget_remaining",
        "Units left in a budget's current period, net of reservations (at the last admission).",
        ("limit",),
        tenant=True,
        mode="mostrecent",
    ),
    "limits_loaded_at": _Spec(
        Gauge,
        "usage_proxy_limits_loaded_timestamp_seconds",
        "When the limits file in use was loaded (Unix time).",
        mode="livemin",
    ),
    "limits_reload_failures": _Spec(
        Counter,
        "usage_proxy_limits_reload_failures",
        "Limits files that could not be loaded (the policies in use stay).",
    ),
    "limits_restored": _Spec(
        Counter,
        "usage_proxy_limits_restored_records",
        "Journaled records the budgets were rebuilt from at start.",
    ),
    # Prices (--prices, proxy.serving.pricesfile): what was spent, at each record's time.
    "spend": _Spec(
        Counter,
        "usage_proxy_spend",
        "Amount billed in the price file's currency, each record priced at its time "
        "(a float for dashboards: usage-proxy report --prices is the exact figure).",
        ("model", "currency"),
        tenant=True,
    ),
    "unpriced": _Spec(
        Counter,
        "usage_proxy_unpriced_records",
        "Records the price file could not price (no price in force, or a unit without one).",
        ("model",),
        tenant=True,
    ),
    "prices_loaded_at": _Spec(
        Gauge,
        "usage_proxy_prices_loaded_timestamp_seconds",
        "When the price file in use was loaded (Unix time).",
        mode="livemin",
    ),
    "prices_reload_failures": _Spec(
        Counter,
        "usage_proxy_prices_reload_failures",
        "Price files that could not be loaded (the prices in use stay).",
    ),
    # The shared limits store (--limits-store, proxy.limitstore.guard).
    "store_seconds": _Spec(
        Histogram,
        "usage_proxy_limits_store_seconds",
        "Round trips to the limits store by operation (failed and timed out ones included).",
        ("op",),
        buckets=LATENCY_BUCKETS,
    ),
    "store_errors": _Spec(
        Counter,
        "usage_proxy_limits_store_errors",
        "Limits store calls that failed, by kind (timeout, or the client's error class).",
        ("kind",),
    ),
    "store_breaker": _Spec(
        Gauge,
        "usage_proxy_limits_store_breaker_open",
        "1 while the circuit breaker skips the limits store, else 0.",
        mode="livemax",
    ),
    "fail_admissions": _Spec(
        Counter,
        "usage_proxy_limits_fail_mode_admissions",
        "Requests decided by the fail mode, not the store, by mode and reason (unreachable; "
        "rebuilding: the store was found empty; and local mode's refusals of what it cannot "
        "divide: replicas_unknown, no_remainder).",
        ("mode", "reason"),
    ),
    "store_rebuilds": _Spec(
        Counter,
        "usage_proxy_limits_store_rebuilds",
        "Times this replica found the limits store empty and started a rebuild.",
    ),
    "store_replicas": _Spec(
        Gauge,
        "usage_proxy_limits_store_replicas",
        "The replica count local fail mode divides by, as of the last heartbeat (0: not "
        "known yet; limited tenants in local mode are refused while the store cannot answer).",
        mode="livemax",
    ),
    "store_remainders": _Spec(
        Gauge,
        "usage_proxy_limits_store_remainders",
        "Budgets this replica holds a remainder of (what the store last said was left), "
        "which local fail mode divides; a budget without one is refused in an outage.",
        mode="livemin",
    ),
}


def shown_tenants(directory: Path) -> set[str]:
    """The tenant label values (``other`` aside) the pod's multiprocess ``directory``
    already holds, read once as a worker starts."""
    pod = CollectorRegistry()
    multiprocess.MultiProcessCollector(pod, path=str(directory))  # type: ignore[no-untyped-call]
    return {
        sample.labels["tenant"]
        for family in pod.collect()
        for sample in family.samples
        if sample.labels.get("tenant", OTHER) != OTHER
    }


class DriftMetrics(Protocol):
    """What the reconciler writes: the engine's growth, the drift, the windows."""

    engine_prompt: Counter
    engine_completion: Counter
    unbilled_prompt: Counter
    unbilled_completion: Counter
    overbilled_prompt: Counter
    overbilled_completion: Counter
    unbilled_in_seconds: Counter
    windows: Counter
    last_settled: Gauge


class PodDriftMetrics:
    """The reconciler's metrics alone, in the pod's multiprocess directory: a pod's
    supervisor reconciles but serves no request (a whole ``Metrics`` there would add a 0
    to every gauge the workers set, and a ``livemin`` one would show it)."""

    def __init__(self, settings: Settings) -> None:
        for attr in (*DriftMetrics.__annotations__, "reconcile_interval"):
            setattr(self, attr, SPECS[attr].build(None, ()))
        self.reconcile_interval.set(settings.reconcile_interval)

    engine_prompt: Counter
    engine_completion: Counter
    unbilled_prompt: Counter
    unbilled_completion: Counter
    overbilled_prompt: Counter
    overbilled_completion: Counter
    unbilled_in_seconds: Counter
    windows: Counter
    last_settled: Gauge
    reconcile_interval: Gauge


class Metrics:
    """One registry per application, holding the metrics of ``SPECS``."""

    requests: Counter
    reported: Counter
    billed: Counter
    over: Counter
    reported_completion: Counter
    billed_completion: Counter
    billed_cached: Counter
    billed_audio: Counter
    reconcile_interval: Gauge
    tokenization: Histogram
    added: Histogram
    upstream_errors: Counter
    journal_failures: Counter
    journal_ready: Gauge
    journal_replaced: Counter
    refused: Counter
    invalid_usage: Counter
    shortcuts_trusted: Gauge
    recount_disagreements: Counter
    aborted: Counter
    stalled_clients: Counter
    unmetered: Counter
    keys_loaded: Gauge
    keys_loaded_at: Gauge
    keys_reload_failures: Counter
    engine_prompt: Counter
    unbilled_prompt: Counter
    overbilled_prompt: Counter
    engine_completion: Counter
    unbilled_completion: Counter
    overbilled_completion: Counter
    unbilled_in_seconds: Counter
    windows: Counter
    last_settled: Gauge
    dead_records: Gauge
    exported: Counter
    export_failures: Counter
    backlog: Gauge
    tasks: Gauge
    genai: Histogram
    limited: Counter
    prompt_counts: Counter
    budget_remaining: Gauge
    limits_loaded_at: Gauge
    limits_reload_failures: Counter
    limits_restored: Counter
    spend: Counter
    unpriced: Counter
    prices_loaded_at: Gauge
    prices_reload_failures: Counter
    store_seconds: Histogram
    store_errors: Counter
    store_breaker: Gauge
    fail_admissions: Counter
    store_rebuilds: Counter
    store_replicas: Gauge
    store_remainders: Gauge

    def __init__(
        self,
        settings: Settings,
        trusted_tenants: Iterable[str] = (),
        served: Callable[[str], bool] | None = None,
        *,
        multiprocess_dir: Path | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        # A worker of a pod: the page is the directory's, every worker's values combined.
        self.multiprocess_dir = multiprocess_dir
        # Whether a model name is one the upstream serves: others are labelled 'unknown',
        # so a client's made-up model names cannot grow the series.
        self._served = served
        self._tenants = settings.metrics_tenant_label
        self._max_tenants = settings.metrics_max_tenants
        # A worker restarted in a pod: the series its predecessors labelled stay in the
        # pod's sums, so they count against its cap (else each restart adds a cap's worth).
        self._seen: set[str] = shown_tenants(multiprocess_dir) if multiprocess_dir else set()
        # Tenants from the API-key map are a known, bounded set: never folded into 'other'.
        self._trusted = frozenset(trusted_tenants)
        # Labelled series already looked up, by label values (as bounded as the series).
        self._children: dict[tuple[str, ...], tuple[Any, Any, Any, Any]] = {}
        self._genai_children: dict[tuple[str, str, str], Any] = {}
        self._metered_children: dict[tuple[str, ...], tuple[Any, ...]] = {}
        self._budget_children: dict[tuple[str, ...], Any] = {}
        tenant = ("tenant",) if self._tenants else ()
        for attr, spec in SPECS.items():
            setattr(self, attr, spec.build(self.registry, tenant))
        self.journal_ready.set(1)  # the journal's own health once metering starts
        self.reconcile_interval.set(settings.reconcile_interval)
        if multiprocess_dir is None:  # a callback's value never reaches the directory
            self.tasks.set_function(_task_count)

    def sample_tasks(self) -> None:
        """Set the task gauge from this event loop (a worker's sampler calls it, where
        one process reads it at each scrape)."""
        self.tasks.set(_task_count())

    def trust(self, tenants: Iterable[str]) -> None:
        """The tenants of a newly loaded key map: a known, bounded set, never folded."""
        self._trusted = frozenset(tenants)

    def tenant(self, name: str) -> tuple[str, ...]:
        """The tenant label values, capped for cardinality (empty when disabled)."""
        if not self._tenants:
            return ()
        if name in self._seen or name in self._trusted:
            return (name,)
        if len(self._seen) < self._max_tenants:
            self._seen.add(name)
            return (name,)
        return (OTHER,)

    def model(self, name: str) -> str:
        """The model label: a served model's name, else ``unknown``."""
        if self._served is None or self._served(name):
            return name
        return UNKNOWN

    def audited(self, endpoint: str, model: str, tenant: str, audit: Audit) -> None:
        """One audited answer: its verdict, and the tokens reported, billed, over-reported."""
        requests, reported_c, billed_c, over_c = self._audit_children(
            endpoint, self.model(model), audit.verdict.value, self.tenant(tenant)
        )
        requests.inc()
        if audit.reported is not None:
            reported_c.inc(audit.reported)
        if audit.billed is not None:
            billed_c.inc(audit.billed)
        if audit.over_reported:
            over_c.inc(audit.over_reported)

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

    def metered(
        self,
        endpoint: str,
        model: str,
        tenant: str,
        prompt: int | None,
        completion: int | None,
        *,
        cached: int | None = None,
        seconds: int | None = None,
    ) -> None:
        """One metered (not audited) answer's tokens, reported and billed alike, and its
        cached prompt tokens and audio seconds, per tenant."""
        labels = (endpoint, self.model(model), *self.tenant(tenant))
        children = self._metered_children.get(labels)
        if children is None:
            children = self._metered_children[labels] = tuple(
                c.labels(*labels)
                for c in (
                    self.reported,
                    self.billed,
                    self.reported_completion,
                    self.billed_completion,
                    self.billed_cached,
                    self.billed_audio,
                )
            )
        if prompt:
            children[0].inc(prompt)
            children[1].inc(prompt)
        if completion:
            children[2].inc(completion)
            children[3].inc(completion)
        if cached:
            children[4].inc(cached)
        if seconds:
            children[5].inc(seconds)

    def budget_left(self, budget: str, tenant: str, left: float) -> None:
        """What a reservation left of a tenant's budget (the series looked up once)."""
        key = (budget, *self.tenant(tenant))
        child = self._budget_children.get(key)
        if child is None:
            child = self._budget_children[key] = self.budget_remaining.labels(*key)
        child.set(left)

    def token_usage(
        self, operation: str, model: str, prompt: int | None, completion: int | None
    ) -> None:
        model = self.model(model)
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
        """The page: this application's registry, or the pod's from the directory."""
        if self.multiprocess_dir is None:
            return generate_latest(self.registry)
        pod = CollectorRegistry()
        multiprocess.MultiProcessCollector(pod, path=str(self.multiprocess_dir))  # type: ignore[no-untyped-call]
        return generate_latest(pod)


def _task_count() -> float:
    try:
        return float(len(asyncio.all_tasks()))
    except RuntimeError:  # scraped outside a running loop
        return 0.0
