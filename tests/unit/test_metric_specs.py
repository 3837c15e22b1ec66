"""The traffic's metrics table: names, labels and how a pod's workers combine a gauge."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from proxy.metric_specs import TOKEN_BUCKETS, TRAFFIC_SPECS


def test_every_gauge_says_how_a_pods_workers_combine() -> None:
    """A gauge without a mode would render one series per worker process (prometheus_client's
    default adds a ``pid`` label): every gauge of the table names its mode."""
    gauges = {attr: spec.mode for attr, spec in TRAFFIC_SPECS.items() if spec.kind is Gauge}
    assert len(gauges) >= 8
    assert [attr for attr, mode in gauges.items() if not mode] == []
    assert all(spec.mode is None for spec in TRAFFIC_SPECS.values() if spec.kind is not Gauge)


def test_the_traffic_s_names_are_the_proxy_s_or_opentelemetry_s() -> None:
    """Every name is ``usage_proxy_``'s, but the GenAI histogram, which keeps
    OpenTelemetry's name and token buckets so dashboards built for it read it."""
    foreign = {s.name for s in TRAFFIC_SPECS.values() if not s.name.startswith("usage_proxy_")}
    assert foreign == {"gen_ai_client_token_usage"}
    assert TRAFFIC_SPECS["genai"].buckets == TOKEN_BUCKETS
    assert list(TOKEN_BUCKETS) == [4**k for k in range(len(TOKEN_BUCKETS))]


def test_a_counter_s_name_has_no_total_suffix() -> None:
    """prometheus_client appends ``_total`` to a counter's name: a name that had it would
    be exported as ``..._total_total``."""
    counters = [s.name for s in TRAFFIC_SPECS.values() if s.kind is Counter]
    assert counters
    assert [n for n in counters if n.endswith("_total")] == []
