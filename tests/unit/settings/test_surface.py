"""What the proxy shows: tenant labels only on the admin port."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from proxy.settings import Settings


def test_tenant_labels_are_never_served_where_tenants_can_read_them() -> None:
    """Regression: with --metrics-tenant-label and no --admin-port, /metrics on the main
    port (which needs no key, as vLLM's) showed every tenant's name and token volumes to
    any tenant. The combination is now refused with a message that says what to do."""
    with pytest.raises(ValidationError) as refused:
        Settings(upstream="http://x", metrics_tenant_label=True)
    (error,) = refused.value.errors()
    assert error["loc"] == ("metrics_tenant_label",)
    assert "--admin-port" in error["msg"]
    assert Settings(upstream="http://x", metrics_tenant_label=True, admin_port=9001).admin_port
