"""The metrics table: tenant labels and their cap; a pod's page from its workers' files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from prometheus_client import multiprocess
from prometheus_client.parser import text_string_to_metric_families

from proxy.limit_metric_specs import LIMIT_SPECS
from proxy.metric_specs import TRAFFIC_SPECS
from proxy.metrics import SPECS, Metrics
from proxy.settings import Settings

# One worker of a pod: its values written to the pod's directory, as prometheus_client's
# multiprocess mode does when PROMETHEUS_MULTIPROC_DIR is set before it is imported.
WORKER = """
import os, sys
from pathlib import Path
from proxy.metrics import Metrics
from proxy.settings import Settings

failures, ready, remaining, backlog, interval = (float(a) for a in sys.argv[1:])
metrics = Metrics(
    Settings(upstream="http://x", reconcile_interval=interval),
    multiprocess_dir=Path(os.environ["PROMETHEUS_MULTIPROC_DIR"]),
)
metrics.journal_failures.inc(failures)
metrics.journal_ready.set(ready)
metrics.budget_remaining.labels("prompt_tokens_per_month").set(remaining)
metrics.backlog.labels("postgres").set(backlog)
print(os.getpid())
"""


def test_tenant_label_cap() -> None:
    """Past the cap, new tenants fold into 'other'; known ones keep their label."""
    metrics = Metrics(
        Settings(
            upstream="http://x", metrics_tenant_label=True, metrics_max_tenants=2, admin_port=9
        )
    )
    assert [metrics.tenant(t) for t in ("a", "b", "c", "a")] == [("a",), ("b",), ("other",), ("a",)]
    assert Metrics(Settings(upstream="http://x")).tenant("a") == ()


def test_a_budgets_remainder_is_set_per_budget_and_capped_tenant() -> None:
    """budget_left sets usage_proxy_budget_remaining for the budget and the tenant's label
    (folded into 'other' past the cap), the latest value of each series kept."""
    metrics = Metrics(
        Settings(
            upstream="http://x", metrics_tenant_label=True, metrics_max_tenants=1, admin_port=9
        )
    )
    for budget, tenant, left in [
        ("prompt_tokens_per_day", "a", 90),
        ("prompt_tokens_per_day", "a", 80),
        ("cost_per_month", "a", 2.5),
        ("prompt_tokens_per_day", "b", 7),
    ]:
        metrics.budget_left(budget, tenant, left)
    value = metrics.registry.get_sample_value
    name = "usage_proxy_budget_remaining"
    assert value(name, {"limit": "prompt_tokens_per_day", "tenant": "a"}) == 80
    assert value(name, {"limit": "cost_per_month", "tenant": "a"}) == 2.5
    assert value(name, {"limit": "prompt_tokens_per_day", "tenant": "other"}) == 7


def test_model_label_is_bound_to_the_served_models() -> None:
    """Issue #39 case 6: gen_ai_request_model took whatever model name a client sent; now a
    name the upstream does not serve is labelled 'unknown' (also on the token counters)."""
    metrics = Metrics(Settings(upstream="http://x"), served=lambda name: name == "minilm")
    for name in ("minilm", "made-up-1", "made-up-2"):
        metrics.token_usage("chat", name, 5, 3)
        metrics.metered("/v1/chat/completions", name, "a", 5, 3)
    text = metrics.render().decode()
    assert 'gen_ai_request_model="minilm"' in text
    assert 'gen_ai_request_model="unknown"' in text
    assert "made-up" not in text


def test_readme_metrics_table_names_what_is_exposed() -> None:
    """Issue #39 case 6: the README named gen_ai_client_token_usage, exposed as
    gen_ai_client_token_usage_token. Every metric of the README's table is exposed under
    that name, and every exposed metric is in the table."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme[readme.index("## Metrics") : readme.index("## Troubleshooting")]
    documented: set[str] = set()
    for row in re.findall(r"^\| `([a-z_{},]+)` \|", section, re.M):
        head, _, rest = row.partition("{")
        if rest:
            choices, _, tail = rest.partition("}")
            documented.update(head + c + tail for c in choices.split(","))
        else:
            documented.add(row)
    registry = Metrics(Settings(upstream="http://x")).registry
    exposed = set()
    for family in registry.collect():
        counter = family.type == "counter"
        exposed.add(f"{family.name}_total" if counter else family.name)
    assert documented == exposed


def test_every_table_s_metric_is_built_once() -> None:
    """The traffic's and the limits' tables together are the registry: no attribute is in
    both (one would hide the other), and every metric's name is built once."""
    assert TRAFFIC_SPECS.keys() & LIMIT_SPECS.keys() == set()
    names = [spec.name for spec in SPECS.values()]
    assert len(names) == len(set(names))
    registry = Metrics(Settings(upstream="http://x")).registry
    assert len(list(registry.collect())) == len(SPECS)


def _worker(directory: Path, *values: float) -> int:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    done = subprocess.run(
        [sys.executable, "-c", WORKER, *map(str, values)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return int(done.stdout)


def _page(directory: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = Metrics(Settings(upstream="http://x"), multiprocess_dir=directory).render().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_a_pods_page_sums_counters_and_combines_gauges_by_their_mode(tmp_path: Path) -> None:
    """Two worker processes write one directory: the page (any worker's render) sums their
    counters and combines each gauge by its mode: journal ready the lowest of the live
    workers (one bad shard raises the alarm), backlogs summed, a budget's remainder the
    most recent write, the interval the largest. A dead worker's live gauges leave the page
    (``mark_process_dead``), its counters stay (a pod's counters never go down)."""
    first = _worker(tmp_path, 3, 1, 70, 4, 30)
    second = _worker(tmp_path, 5, 0, 40, 6, 60)
    page = _page(tmp_path)
    assert page[("usage_proxy_journal_failures_total", ())] == 8
    assert page[("usage_proxy_journal_ready", ())] == 0
    assert page[("usage_proxy_export_backlog_records", (("sink", "postgres"),))] == 10
    assert page[("usage_proxy_budget_remaining", (("limit", "prompt_tokens_per_month"),))] == 40
    assert page[("usage_proxy_reconcile_interval_seconds", ())] == 60
    assert not any(dict(labels).get("pid") for _, labels in page)  # one series per metric

    multiprocess.mark_process_dead(second, str(tmp_path))
    page = _page(tmp_path)
    assert page[("usage_proxy_journal_failures_total", ())] == 8
    assert page[("usage_proxy_journal_ready", ())] == 1
    assert page[("usage_proxy_export_backlog_records", (("sink", "postgres"),))] == 4
    assert first != second


def test_one_process_page_is_its_own_registry() -> None:
    """Without a directory (one process, today's proxy) the page is the application's own
    registry, the task gauge read at each scrape."""
    metrics = Metrics(Settings(upstream="http://x"))
    metrics.journal_failures.inc(2)
    text = metrics.render().decode()
    assert "usage_proxy_journal_failures_total 2.0" in text
    assert "usage_proxy_event_loop_tasks 0.0" in text  # no running loop here


def test_export_levels_sum_every_journal_a_process_delivers() -> None:
    """A worker's own shard and an adopted one report per sink: the gauges are their sums,
    each journal's latest level counted once (never the last reporter's alone)."""
    metrics = Metrics(Settings(upstream="http://x"))
    metrics.export_levels("journal.worker-0.sqlite", "jsonl", 1, 0)
    metrics.export_levels("journal.worker-2.sqlite", "jsonl", 5, 2)
    metrics.export_levels("journal.worker-2.sqlite", "cloudevents", 7, 0)
    metrics.export_levels("journal.worker-0.sqlite", "jsonl", 3, 1)
    value = metrics.registry.get_sample_value
    assert value("usage_proxy_export_backlog_records", {"sink": "jsonl"}) == 8
    assert value("usage_proxy_export_dead_records", {"sink": "jsonl"}) == 3
    assert value("usage_proxy_export_backlog_records", {"sink": "cloudevents"}) == 7
