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
