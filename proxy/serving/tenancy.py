"""Tenant attribution: who pays for a request.

Trust rules (docs/metering.md): when an API-key map is configured, the bearer key decides
and nothing the client writes in other headers matters; a request whose key is missing or
unknown is refused (unless anonymous use is allowed). Without a key map, the configured
tenant header is trusted (an authenticating gateway in front sets it), except when the
client listed it in ``Connection`` (a hop-by-hop header is the previous hop's, not ours).

Keys are compared as SHA-256 digests of their raw bytes and never kept, logged or recorded
in clear; records carry only a short prefix of the digest.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from proxy.accounting.money import DuplicateKeyError, UniqueKeyLoader

ANONYMOUS = "anonymous"
KEY_HASH_CHARS = 12
MAX_TENANT_CHARS = 200


@dataclass(frozen=True, slots=True)
class Attribution:
    tenant: str
    key_hash: str | None
    from_key_map: bool = False


@dataclass(frozen=True, slots=True)
class Refusal:
    """The request is not forwarded: ``status`` with ``message`` in vLLM's error shape."""

    status: int
    message: str


def raw_bytes(value: str) -> bytes:
    """The bytes a client sent in a header (aiohttp keeps undecodable ones as surrogates)."""
    return value.encode("utf-8", "surrogateescape")


def key_digest(key: str) -> str:
    return hashlib.sha256(raw_bytes(key)).hexdigest()


def bearer_key(headers: Mapping[str, str]) -> str | None:
    """The bearer token of an ``Authorization`` header, if any."""
    value = headers.get("Authorization") or headers.get("authorization")
    if not value:
        return None
    scheme, _, token = value.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


class KeyFileError(ValueError):
    """An ``--api-keys`` file that cannot be used; the message names it and the fix."""


DIGEST_RECIPE = "printf %s 'THE-KEY' | sha256sum"


def load_api_keys(path: Path) -> dict[str, str]:
    """Read ``tenant: sha256-hex`` (or a list of digests) from YAML/JSON; digest -> tenant."""
    try:
        data: Any = yaml.load(path.read_text(encoding="utf-8"), Loader=UniqueKeyLoader) or {}
    except FileNotFoundError:
        raise KeyFileError(f"{path}: no such file; create it or fix the path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyFileError(f"{path}: cannot be read ({exc})") from None
    except DuplicateKeyError as exc:
        raise KeyFileError(f"{path}: {exc.problem}: a tenant is listed once") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        problem = getattr(exc, "problem", None) or "not YAML"
        raise KeyFileError(f"{path}: not valid YAML/JSON{line} ({problem})") from None
    if not isinstance(data, dict):
        raise KeyFileError(f"{path}: expected a mapping of tenant to SHA-256 digests")
    digests: dict[str, str] = {}
    for tenant, value in data.items():
        problem = tenant_problem(str(tenant))
        if problem:
            raise KeyFileError(f"{path}: tenant {tenant!r}: {problem}")
        for digest in value if isinstance(value, list) else [value]:
            text = str(digest).strip().lower()
            if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
                raise KeyFileError(
                    f"{path}: tenant {tenant!r} has a value that is not a SHA-256 hex digest "
                    f"(a plaintext key?); list the key's digest instead: {DIGEST_RECIPE}"
                )
            digests[text] = str(tenant)
    return digests


def tenant_problem(value: str) -> str | None:
    """Why ``value`` cannot name a tenant, or None: 1-200 printable characters of text."""
    if not value:
        return "is empty"
    if len(value) > MAX_TENANT_CHARS:
        return f"is longer than {MAX_TENANT_CHARS} characters"
    if not value.isprintable() or any("\udc80" <= c <= "\udcff" for c in value):
        return "is not printable UTF-8 text"
    return None


def _values(headers: Mapping[str, str], name: str) -> list[str]:
    """Every value of header ``name`` (a plain mapping holds at most one)."""
    getall = getattr(headers, "getall", None)
    if getall is not None:
        return list(getall(name, []))
    value = headers.get(name)
    return [] if value is None else [value]


def connection_tokens(headers: Any) -> set[str]:
    """Header names the client declared hop-by-hop in ``Connection`` (lower case)."""
    getall = getattr(headers, "getall", None)
    values = getall("Connection", []) if getall else [headers.get("Connection", "")]
    return {t.strip().lower() for v in values for t in v.split(",") if t.strip()}


class TenantResolver:
    """Resolve the tenant of a request from its headers (see the module's trust rules)."""

    def __init__(
        self,
        *,
        header: str | None = None,
        key_tenants: Mapping[str, str] | None = None,
        allow_anonymous: bool = False,
    ) -> None:
        self._header = header
        self._keys = dict(key_tenants or {})
        self._allow_anonymous = allow_anonymous

    @property
    def key_tenants(self) -> frozenset[str]:
        return frozenset(self._keys.values())

    @property
    def key_count(self) -> int:
        return len(self._keys)

    def replace_keys(self, key_tenants: Mapping[str, str]) -> None:
        """Use a new key map from the next request on (one assignment: a request sees the
        old map or the new one, never a mix; requests already attributed keep theirs)."""
        self._keys = dict(key_tenants)

    def resolve(self, headers: Mapping[str, str]) -> Attribution | Refusal:
        if len(_values(headers, "Authorization")) > 1:
            return Refusal(400, "more than one Authorization header: send one key")
        key = bearer_key(headers)
        digest = key_digest(key) if key else None
        short = digest[:KEY_HASH_CHARS] if digest else None
        if self._keys:
            if digest in self._keys:
                return Attribution(self._keys[digest], short, from_key_map=True)
            if self._allow_anonymous:
                return Attribution(ANONYMOUS, short)
            return Refusal(401, "Unauthorized")
        if self._header and self._header.lower() not in connection_tokens(headers):
            values = _values(headers, self._header)
            if len(values) > 1:  # a hop appended its own: which one is the gateway's?
                return Refusal(400, f"more than one {self._header} header: send one tenant")
            if values:
                value = values[0].strip()
                if "," in value:  # what a list-merging hop makes of two values
                    return Refusal(400, f"header {self._header} holds a list: send one tenant")
                problem = tenant_problem(value)
                if problem:
                    return Refusal(400, f"header {self._header} {problem}")
                return Attribution(value, short)
        return Attribution(ANONYMOUS, short)
