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
from pathlib import Path
from typing import Any, Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

from proxy.accounting.verdicts import Audit
from proxy.limit_metric_specs import LIMIT_SPECS
from proxy.metric_specs import TRAFFIC_SPECS, Spec
from proxy.settings import Settings

# Every metric the proxy exports, by the attribute that holds it.
SPECS: dict[str, Spec] = {**TRAFFIC_SPECS, **LIMIT_SPECS}
OTHER = "other"
UNKNOWN = "unknown"


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
    """One registry per application, holding the metrics of ``SPECS`` (proxy/metric_specs.py)."""

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
        # Each journal's (its own shard, those it adopted) backlog and dead records by sink.
        self._levels: dict[tuple[str, str], tuple[int, int]] = {}
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

    def export_levels(self, journal: str, sink: str, backlog: int, dead: int) -> None:
        """One journal's records ``sink`` has not acknowledged, and its dead letters: the
        gauges are the sums over every journal this process delivers (a pod's worker
        delivers the shards a larger pod left beside its own)."""
        self._levels[(journal, sink)] = (backlog, dead)
        mine = [level for (_, name), level in self._levels.items() if name == sink]
        self.backlog.labels(sink).set(sum(b for b, _ in mine))
        self.dead_records.labels(sink).set(sum(d for _, d in mine))

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
