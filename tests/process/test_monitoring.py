"""The shipped monitoring: the Grafana dashboard and the Prometheus alert rules query only
metrics the proxy exports, and each panel and rule says what its issue asked of it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from proxy.metrics import Metrics
from proxy.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def test_dashboard_queries_known_metrics() -> None:
    """Every metric a Grafana panel queries is one the proxy exports."""
    dashboard = json.loads((ROOT / "deploy/grafana/dashboards/usage-proxy.json").read_text())
    registry = Metrics(Settings(upstream="http://x")).registry
    exported = set()
    for family in registry.collect():
        exported.add(family.name)
        exported.update(s.name for s in family.samples)
    exported.update(f"{n}_total" for n in list(exported))
    exported.update(f"{n}_bucket" for n in list(exported))
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            for name in re.findall(r"\b(usage_proxy_[a-z_]+|gen_ai_[a-z_]+)", target["expr"]):
                assert name in exported, (panel["title"], name)


def test_alert_rules_query_known_metrics() -> None:
    """The Prometheus alert rules parse, are loaded by prometheus.yml and compose, and
    every metric they use is one the proxy exports (the reconciliation drift alert)."""
    rules = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text())
    config = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    assert config["rule_files"] == ["/etc/prometheus/alerts.yml"]
    assert "alerts.yml:/etc/prometheus/alerts.yml" in (ROOT / "compose.yaml").read_text()
    registry = Metrics(Settings(upstream="http://x")).registry
    exported = {s.name for family in registry.collect() for s in family.samples}
    exported |= {family.name for family in registry.collect()}
    exported |= {f"{f.name}_total" for f in registry.collect() if f.type == "counter"}
    alerts = {r["alert"]: r["expr"] for g in rules["groups"] for r in g["rules"]}
    assert "UsageLedgerDrift" in alerts
    for name, expr in alerts.items():
        for metric in re.findall(r"\busage_proxy_[a-z_]+", expr):
            assert metric in exported, (name, metric)


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(
        (ROOT / "deploy/grafana/dashboards/usage-proxy.json").read_text()
    )
    return data


def test_dashboard_has_variables_not_a_fixed_datasource() -> None:
    """Issue #39 case 7: the datasource uid was hard-coded and there were no variables.
    Every panel and query uses ${datasource}, and every query is scoped to $instance."""
    data = dashboard()
    variables = {v["name"]: v for v in data["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["instance"]["includeAll"] is True
    for panel in data["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            for selector in re.findall(
                r"\b(?:usage_proxy|gen_ai)_[a-z_]+(\{[^}]*\})?", target["expr"]
            ):
                assert 'instance=~"$instance"' in selector, (panel["title"], target["expr"])


def test_no_dashboard_panel_mixes_seconds_and_tokens() -> None:
    """Issue #39 case 7: the drift panel drew seconds since the last window on the token
    axis. A panel's queries are all times (time() or _seconds metrics) or none are."""
    for panel in dashboard()["panels"]:
        timed = ["time()" in t["expr"] or "_seconds" in t["expr"] for t in panel["targets"]]
        assert all(timed) or not any(timed), panel["title"]
        if all(timed) and "latency" not in panel["title"].lower():
            assert panel["fieldConfig"]["defaults"]["unit"] == "s", panel["title"]


def test_engine_panel_compares_like_with_like() -> None:
    """Issue #39 case 7: the engine's counters (every endpoint) were compared with
    scoring-only counters. The proxy's token counters now cover every metered operation
    (tests/app/test_metrics.py), so the panel sums them unfiltered, never by endpoint."""
    panel = next(
        p for p in dashboard()["panels"] if p["title"].startswith("Reconciliation: engine")
    )
    exprs = [t["expr"] for t in panel["targets"]]
    assert any("usage_proxy_engine_prompt_tokens_total" in e for e in exprs)
    assert any("usage_proxy_billed_prompt_tokens_total" in e for e in exprs)
    assert any("usage_proxy_billed_completion_tokens_total" in e for e in exprs)
    assert not any("endpoint" in e for e in exprs)
    assert not any("scoring" in t["legendFormat"] for t in panel["targets"])


def alert_rules() -> dict[str, dict[str, Any]]:
    rules = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text())
    return {r["alert"]: r for g in rules["groups"] for r in g["rules"]}


def test_alerts_cover_export_backlog_failures_and_dead_letters() -> None:
    """Issue #39 case 8: nothing fired on an export backlog, export failures or dead
    letters; each has a rule on its metric now."""
    alerts = alert_rules()
    assert "usage_proxy_export_backlog_records" in alerts["UsageExportBacklog"]["expr"]
    assert "usage_proxy_export_failures_total" in alerts["UsageExportFailing"]["expr"]
    assert "usage_proxy_export_dead_records" in alerts["UsageDeadLetters"]["expr"]
    for name in ("UsageExportBacklog", "UsageExportFailing", "UsageDeadLetters"):
        assert alerts[name]["annotations"]["summary"], name


def test_reconciliation_stalled_is_silent_when_reconciliation_is_off() -> None:
    """Issue #39 case 8: UsageReconciliationStalled fired forever with
    --reconcile-interval 0 (nothing settles then). The rule now requires the interval gauge
    above 0, and the gauge is 0 exactly when reconciliation is off."""
    expr = " ".join(alert_rules()["UsageReconciliationStalled"]["expr"].split())
    assert expr.endswith("and usage_proxy_reconcile_interval_seconds > 0")
    for interval, shown in ((0, 0.0), (15, 15.0)):
        metrics = Metrics(Settings(upstream="http://x", reconcile_interval=interval))
        text = metrics.render().decode()
        assert f"usage_proxy_reconcile_interval_seconds {shown}" in text
