"""The limits' metrics table: budgets, prices and the shared store."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from proxy.limit_metric_specs import LIMIT_SPECS


def test_every_limits_gauge_says_how_a_pods_workers_combine() -> None:
    """A gauge without a mode would render one series per worker process: each of the
    limits' gauges names its mode, and nothing else has one."""
    gauges = {attr: spec.mode for attr, spec in LIMIT_SPECS.items() if spec.kind is Gauge}
    assert len(gauges) >= 4
    assert [attr for attr, mode in gauges.items() if not mode] == []
    assert all(spec.mode is None for spec in LIMIT_SPECS.values() if spec.kind is not Gauge)


def test_the_limits_names_are_the_proxy_s_and_no_counter_ends_in_total() -> None:
    """Every name is ``usage_proxy_``'s; prometheus_client appends ``_total`` to a
    counter's, so none has it already."""
    names = [s.name for s in LIMIT_SPECS.values()]
    assert [n for n in names if not n.startswith("usage_proxy_")] == []
    counters = [s.name for s in LIMIT_SPECS.values() if s.kind is Counter]
    assert [n for n in counters if n.endswith("_total")] == []
