"""Tenant attribution: a trusted header (only when configured), an API-key map, or anonymous.

Keys are compared as SHA-256 digests and never kept, logged or recorded in clear; records
carry only a short prefix of the digest.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

ANONYMOUS = "anonymous"
KEY_HASH_CHARS = 12
Source = Literal["header", "api-key"]


@dataclass(frozen=True, slots=True)
class Attribution:
    tenant: str
    key_hash: str | None


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def bearer_key(headers: Mapping[str, str]) -> str | None:
    """The bearer token of an ``Authorization`` header, if any."""
    value = headers.get("Authorization") or headers.get("authorization")
    if not value:
        return None
    scheme, _, token = value.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def load_api_keys(path: Path) -> dict[str, str]:
    """Read ``tenant: sha256-hex`` (or a list of digests) from YAML/JSON; digest -> tenant."""
    data: Any = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of tenant to SHA-256 digests")
    digests: dict[str, str] = {}
    for tenant, value in data.items():
        for digest in value if isinstance(value, list) else [value]:
            text = str(digest).strip().lower()
            if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
                raise ValueError(f"{path}: tenant {tenant!r} has a value that is not a SHA-256 hex")
            digests[text] = str(tenant)
    return digests


class TenantResolver:
    """Resolve the tenant of a request from its headers, in the configured order."""

    def __init__(
        self,
        *,
        header: str | None = None,
        key_tenants: Mapping[str, str] | None = None,
        order: Sequence[Source] = ("header", "api-key"),
    ) -> None:
        self._header = header
        self._keys = dict(key_tenants or {})
        self._order = tuple(order)

    def resolve(self, headers: Mapping[str, str]) -> Attribution:
        key = bearer_key(headers)
        digest = key_digest(key) if key else None
        short = digest[:KEY_HASH_CHARS] if digest else None
        for source in self._order:
            if source == "header" and self._header:
                value = (headers.get(self._header) or "").strip()
                if value:
                    return Attribution(value[:200], short)
            if source == "api-key" and digest and digest in self._keys:
                return Attribution(self._keys[digest], short)
        return Attribution(ANONYMOUS, short)
