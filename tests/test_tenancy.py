"""Tenant attribution: trusted header only when configured, API-key digests, anonymous."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.tenancy import ANONYMOUS, TenantResolver, key_digest, load_api_keys

KEYS = {key_digest("sk-acme"): "acme", key_digest("sk-beta"): "beta"}


@pytest.mark.parametrize(
    ("header", "order", "headers", "tenant"),
    [
        (None, ("header", "api-key"), {"X-Tenant-Id": "evil"}, ANONYMOUS),
        (
            None,
            ("header", "api-key"),
            {"X-Tenant-Id": "evil", "Authorization": "Bearer sk-acme"},
            "acme",
        ),
        (
            "X-Tenant-Id",
            ("header", "api-key"),
            {"X-Tenant-Id": "team-a", "Authorization": "Bearer sk-acme"},
            "team-a",
        ),
        (
            "X-Tenant-Id",
            ("api-key", "header"),
            {"X-Tenant-Id": "team-a", "Authorization": "Bearer sk-acme"},
            "acme",
        ),
        ("X-Tenant-Id", ("header",), {"Authorization": "Bearer sk-beta"}, ANONYMOUS),
        (None, ("api-key",), {"Authorization": "Bearer sk-unknown"}, ANONYMOUS),
        (None, ("api-key",), {"Authorization": "Basic c2stYWNtZQ=="}, ANONYMOUS),
    ],
)
def test_resolution_order(
    header: str | None, order: tuple[str, ...], headers: dict[str, str], tenant: str
) -> None:
    """The configured order decides; an unconfigured header is never trusted."""
    resolver = TenantResolver(header=header, key_tenants=KEYS, order=order)  # type: ignore[arg-type]
    assert resolver.resolve(headers).tenant == tenant


def test_key_hash_is_short_digest_never_the_key() -> None:
    """Records carry 12 hex chars of the SHA-256, not the key."""
    who = TenantResolver(key_tenants=KEYS).resolve({"Authorization": "Bearer sk-acme"})
    assert who.key_hash == key_digest("sk-acme")[:12]
    assert "sk-acme" not in repr(who)


def test_api_keys_file(tmp_path: Path) -> None:
    """tenant: digest or tenant: [digests]; anything else is a clear error."""
    path = tmp_path / "keys.yaml"
    path.write_text(
        f"acme: {key_digest('a')}\nbeta:\n  - {key_digest('b')}\n  - {key_digest('c')}\n"
    )
    assert load_api_keys(path) == {
        key_digest("a"): "acme",
        key_digest("b"): "beta",
        key_digest("c"): "beta",
    }
    path.write_text("acme: sk-plaintext-key\n")
    with pytest.raises(ValueError, match="not a SHA-256"):
        load_api_keys(path)
