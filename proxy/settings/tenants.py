"""The options of who pays and what bounds them: the tenant header or key file, the
limits and prices files, the limits store shared by replicas (no password on the command
line) and its fail mode, and anonymous requests."""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import parse_qs

from pydantic import BaseModel, Field, field_validator

from proxy.accounting.units import units_named


class TenantOptions(BaseModel):
    """Who pays: tenants, keys, limits, prices and the limits store."""

    tenant_header: str | None = Field(
        None,
        description="Request header naming the tenant, set by a trusted gateway in front. "
        "Used only when --api-keys is not set; ignored when the client lists it in Connection.",
    )
    api_keys: Path | None = Field(
        None,
        description="YAML/JSON file mapping tenant to SHA-256 hex digests of bearer keys. "
        "When set, the key decides the tenant and requests without a listed key get 401.",
    )
    limits: Path | None = Field(
        None,
        description="YAML/JSON file of budgets and rate limits per tenant, model and key "
        "(docs/metering.md, 'Budgets and rate limits'); reloaded on SIGHUP and when it changes.",
    )
    prices: Path | None = Field(
        None,
        description="YAML/JSON price file: per served model (and a default) a price per unit "
        f"({units_named()}; LiteLLM's "
        "input_cost_per_token etc. too), a currency and effective dates (docs/metering.md, "
        "'Prices'); for the limits file's cost_per_* budgets and the spend metrics; "
        "reloaded on SIGHUP and when it changes.",
    )
    limits_store: str | None = Field(
        None,
        description="Share the --limits among replicas on a Redis/Valkey store: "
        "redis://host:port/db (also rediss://, valkey://, valkeys://). No password in the "
        "URL: USAGE_PROXY_LIMITS_STORE_PASSWORD or --limits-store-password-file.",
    )
    limits_store_password_file: Path | None = Field(
        None, description="File holding the limits store's password (one line)."
    )
    limits_store_timeout: float = Field(
        0.05,
        gt=0,
        description="Seconds one limits store round trip may take; past it (or with the "
        "circuit breaker open) the fail mode decides.",
    )
    limits_fail_mode: Literal["closed", "open", "local"] = Field(
        "local",
        description="While the limits store is unreachable, or rebuilding after it was found "
        "empty: closed (503, nothing forwarded), open (admit, count), local (each replica "
        "enforces its share: what the store last said was left of a budget / replicas, "
        "at most limit / replicas against its own usage); a tenant's fail_mode in the "
        "limits file overrides it.",
    )
    limits_replicas: int = Field(
        0,
        ge=0,
        description="Replicas that share the limits store (what local fail mode divides "
        "by, and how many journals a store found empty waits for); 0: the live count the "
        "store reported while it was up. It counts pods: with --workers N each worker is "
        "a replica, and the count is multiplied by N.",
    )
    limits_reservation_ttl: float = Field(
        600.0,
        gt=0,
        description="Seconds a reservation in the limits store lives unless its replica "
        "renews it: a live replica extends its requests' in flight every TTL / 3 (a "
        "crashed replica's are given back after it).",
    )
    allow_anonymous: bool = Field(
        False,
        description="With --api-keys: forward requests without a listed key, billed to "
        "'anonymous', instead of answering 401.",
    )

    @field_validator("limits_store")
    @classmethod
    def _store_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        scheme, sep, rest = value.partition("://")
        if not sep or scheme not in ("redis", "rediss", "valkey", "valkeys"):
            raise ValueError("a redis://, rediss://, valkey:// or valkeys:// URL")
        netloc, _, query = rest.partition("?")
        in_userinfo = "@" in netloc and ":" in netloc.split("@", 1)[0]
        if in_userinfo or "password" in parse_qs(query):
            raise ValueError(
                "no password on the command line: set USAGE_PROXY_LIMITS_STORE_PASSWORD or "
                "--limits-store-password-file"
            )
        return value
