"""Tenant attribution: trusted header only when configured, API-key digests, anonymous."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from proxy.serving.tenancy import (
    ANONYMOUS,
    Attribution,
    KeyFileError,
    Refusal,
    TenantResolver,
    key_digest,
    load_api_keys,
)

KEYS = {key_digest("sk-acme"): "acme", key_digest("sk-beta"): "beta"}


BAD = "caf\udce9"  # a latin-1 byte, as aiohttp hands undecodable header bytes over


@pytest.mark.parametrize(
    ("header", "headers", "expected"),
    [
        # a key map is configured: the key decides, whatever else the client sends
        (None, {"X-Tenant-Id": "evil", "Authorization": "Bearer sk-acme"}, "acme"),
        ("X-Tenant-Id", {"X-Tenant-Id": "beta", "Authorization": "Bearer sk-acme"}, "acme"),
        ("X-Tenant-Id", {"X-Tenant-Id": "beta"}, Refusal(401, "Unauthorized")),
        ("X-Tenant-Id", {"Authorization": "Bearer sk-unknown"}, Refusal(401, "Unauthorized")),
        (None, {"Authorization": "Basic c2stYWNtZQ=="}, Refusal(401, "Unauthorized")),
        (None, {"Authorization": f"Bearer {BAD}"}, Refusal(401, "Unauthorized")),
        (None, {}, Refusal(401, "Unauthorized")),
    ],
)
def test_the_key_decides_when_keys_are_configured(
    header: str | None, headers: dict[str, str], expected: str | Refusal
) -> None:
    """Regression: key A plus X-Tenant-Id: beta was billed to beta; no key or an unknown
    key was forwarded and billed to anonymous."""
    who = TenantResolver(header=header, key_tenants=KEYS).resolve(headers)
    assert (who.tenant if isinstance(who, Attribution) else who) == expected


def test_allow_anonymous_forwards_unknown_keys_as_anonymous() -> None:
    """--allow-anonymous relaxes the 401; the header still cannot pick a tenant."""
    resolver = TenantResolver(header="X-Tenant-Id", key_tenants=KEYS, allow_anonymous=True)
    who = resolver.resolve({"X-Tenant-Id": "beta", "Authorization": "Bearer sk-unknown"})
    assert isinstance(who, Attribution)
    assert (who.tenant, who.key_hash) == (ANONYMOUS, key_digest("sk-unknown")[:12])


@pytest.mark.parametrize(
    ("header", "headers", "expected"),
    [
        (None, {"X-Tenant-Id": "evil"}, ANONYMOUS),
        ("X-Tenant-Id", {"X-Tenant-Id": "team-a"}, "team-a"),
        ("X-Tenant-Id", {"X-Tenant-Id": "  team-a "}, "team-a"),
        ("X-Tenant-Id", {}, ANONYMOUS),
        ("X-Tenant-Id", {"X-Tenant-Id": "team-a", "Connection": "X-Tenant-Id"}, ANONYMOUS),
        ("X-Tenant-Id", {"X-Tenant-Id": "team-a", "Connection": "close, x-tenant-id"}, ANONYMOUS),
        ("X-Tenant-Id", {"X-Tenant-Id": ""}, Refusal(400, "header X-Tenant-Id is empty")),
        ("X-Tenant-Id", {"X-Tenant-Id": "   "}, Refusal(400, "header X-Tenant-Id is empty")),
        (
            "X-Tenant-Id",
            {"X-Tenant-Id": "t" * 201},
            Refusal(400, "header X-Tenant-Id is longer than 200 characters"),
        ),
        (
            "X-Tenant-Id",
            {"X-Tenant-Id": BAD},
            Refusal(400, "header X-Tenant-Id is not printable UTF-8 text"),
        ),
    ],
)
def test_trusted_header_without_a_key_map(
    header: str | None, headers: dict[str, str], expected: str | Refusal
) -> None:
    """Regression: a header listed in Connection still attributed; an empty value became
    anonymous and a long one was silently cut to 200 characters."""
    who = TenantResolver(header=header).resolve(headers)
    assert (who.tenant if isinstance(who, Attribution) else who) == expected


def test_undecodable_key_bytes_hash_as_sent() -> None:
    """A key with a non-UTF-8 byte is hashed over its raw bytes, never a 500."""
    resolver = TenantResolver(key_tenants={hashlib.sha256(b"caf\xe9").hexdigest(): "latin"})
    who = resolver.resolve({"Authorization": f"Bearer {BAD}"})
    assert isinstance(who, Attribution)
    assert who.tenant == "latin"


def test_key_hash_is_short_digest_never_the_key() -> None:
    """Records carry 12 hex chars of the SHA-256, not the key."""
    who = TenantResolver(key_tenants=KEYS).resolve({"Authorization": "Bearer sk-acme"})
    assert isinstance(who, Attribution)
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


def test_a_tenant_listed_twice_in_the_key_file_is_refused(tmp_path: Path) -> None:
    """Issue #59 item 3: YAML keeps the later of two equal keys, so a tenant listed twice
    lost its first keys without a word. The file is refused, naming both lines."""
    path = tmp_path / "keys.yaml"
    one, two = hashlib.sha256(b"a").hexdigest(), hashlib.sha256(b"b").hexdigest()
    path.write_text(f"acme: {one}\nglobex: {two}\nacme: {two}\n")
    with pytest.raises(KeyFileError, match="'acme' is given twice, at lines 1 and 3"):
        load_api_keys(path)
