"""The metrics table: tenant labels and their cap."""

from __future__ import annotations

from proxy.metrics import Metrics
from proxy.settings import Settings


def test_tenant_label_cap() -> None:
    """Past the cap, new tenants fold into 'other'; known ones keep their label."""
    metrics = Metrics(
        Settings(
            upstream="http://x", metrics_tenant_label=True, metrics_max_tenants=2, admin_port=9
        )
    )
    assert [metrics.tenant(t) for t in ("a", "b", "c", "a")] == [("a",), ("b",), ("other",), ("a",)]
    assert Metrics(Settings(upstream="http://x")).tenant("a") == ()


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
