"""Model discovery: a release outside the proven range is announced once."""

from __future__ import annotations

from proxy.accounting.types import Release


def test_unproven_release_is_announced() -> None:
    """The proxy says once what it assumes for a release outside the proven range."""
    from structlog.testing import capture_logs

    from proxy.serving.catalog import warn_if_unproven

    with capture_logs() as logs:
        warn_if_unproven(Release("0.33.0"))
        warn_if_unproven(Release("0.32.0"))
    assert [e["event"] for e in logs] == ["release_outside_proven_range"]
    assert logs[0]["upstream_version"] == "0.33.0"
