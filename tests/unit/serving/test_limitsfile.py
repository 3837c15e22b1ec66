"""The --limits file reloaded in place: a valid file replaces the policies whole, a bad
one leaves them (logged, counted)."""

from __future__ import annotations

from pathlib import Path

from proxy.limits.policy import Policies, load_policies
from proxy.limitstore.memory import InProcessLimiter
from proxy.metrics import Metrics
from proxy.serving.limitsfile import LimitsFile
from proxy.settings import Settings


def test_reload_replaces_or_keeps(tmp_path: Path) -> None:
    """A good file is in use after the reload; unreadable, invalid or malformed files
    are counted and the policies in use stay."""
    path = tmp_path / "limits.yaml"
    path.write_text("tenants: {acme: {requests_per_minute: 5}}\n")
    limiter = InProcessLimiter(load_policies(path))
    metrics = Metrics(Settings(upstream="http://x"))
    limits = LimitsFile(path, limiter, metrics)
    before = limiter.policies
    for text in ("tenants: {acme: {requests_per_year: 5}}\n", "[unclosed\n", "timezone: X/Y\n"):
        path.write_text(text)
        assert not limits.reload("test")
    path.unlink()
    assert not limits.reload("test")
    assert metrics.limits_reload_failures._value.get() == 4
    assert limiter.policies is before
    path.write_text("default: {concurrency: 3}\n")
    assert limits.reload("test")
    expected = Policies.model_validate({"default": {"concurrency": 3}})
    assert limiter.policies.model_dump() == expected.model_dump()  # its levels read since
