"""The options of what the proxy shows and lets through: the admin port and its metrics
(tenant labels only there), the routes relayed without a record, the prefix-cache salt
that keeps tenants apart inside vLLM, and per-model overrides."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, ValidationInfo, field_validator

from proxy.accounting.dispatch import UNMETERED_FEATURES
from proxy.settings.choices import CacheSalting, ModelOverride, items


class SurfaceOptions(BaseModel):
    """The admin port and metrics, unmetered routes, cache salts, model overrides."""

    admin_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="Serve /metrics, /healthz, /readyz on this port instead of the main one.",
    )
    admin_host: str = Field("0.0.0.0", description="Address for --admin-port.")
    admin_tokens: Path | None = Field(
        None,
        description="YAML/JSON file mapping operator names to SHA-256 hex digests of admin "
        "tokens (a digest or a list), as --api-keys holds keys; reloaded on SIGHUP and when "
        "it changes. When set, --admin-port also serves the read-only admin API under "
        "/usage-proxy/admin/v1 (every tenant's standing, the records of a range) to a bearer "
        "admin token.",
    )
    metrics_tenant_label: bool = Field(
        False,
        description="Label token metrics by tenant (capped by --metrics-max-tenants); needs "
        "--admin-port, since /metrics on the main port needs no key.",
    )
    metrics_max_tenants: int = Field(
        100,
        ge=1,
        description="Distinct tenant label values before folding into 'other' (per worker: "
        "a pod of N workers shows at most N times this, restarts included).",
    )
    allow_unmetered: str = Field(
        "",
        description="Comma-separated routes or request features to relay although nothing "
        "bills them (by default they are refused in vLLM's error shape): paths, e.g. "
        "/v1/load_lora_adapter or /cohere/v2/chat (a final * matches any path "
        "under it, including ones vLLM adds later), and the features "
        + ", ".join(sorted(UNMETERED_FEATURES))
        + ". Each such request is logged (unmetered_relayed) and "
        "counted (usage_proxy_unmetered_requests_total).",
    )
    cache_salt: CacheSalting = Field(
        CacheSalting.TENANT,
        description="tenant: every generation request gets a cache_salt derived from its "
        "tenant (and any salt the client sent), so vLLM's prefix cache is never shared across "
        "tenants and no tenant learns from cached_tokens what another sent; off: tenants "
        "share the prefix cache (a single-tenant deployment).",
    )
    cache_salt_secret: str | None = Field(
        None,
        description="Key of the tenants' cache salts (env/file only). Unset: a random key per "
        "process (the prefix cache is not shared across restarts or replicas); set the same "
        "key on every replica in front of one vLLM.",
    )
    models: dict[str, ModelOverride] = Field(
        default_factory=dict,
        description="Per served-model overrides (config file or JSON in the environment).",
    )

    @field_validator("metrics_tenant_label")
    @classmethod
    def _tenants_not_on_the_main_port(cls, value: bool, info: ValidationInfo) -> bool:
        if value and info.data.get("admin_port") is None:
            raise ValueError(
                "needs --admin-port: tenant names and their token volumes must not be served "
                "on the main port, where /metrics needs no key and every tenant could read "
                "them; put /metrics on a port tenants cannot reach"
            )
        return value

    @field_validator("admin_tokens")
    @classmethod
    def _tokens_on_the_admin_port(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is not None and info.data.get("admin_port") is None:
            raise ValueError(
                "needs --admin-port: the admin API is served on the admin port only, never "
                "on the main port tenants reach"
            )
        return value

    @field_validator("allow_unmetered")
    @classmethod
    def _known_unmetered(cls, value: str) -> str:
        for item in items(value):
            if not item.startswith("/") and item not in UNMETERED_FEATURES:
                raise ValueError(
                    f"{item!r} is neither a path (starting with /) nor one of "
                    + ", ".join(sorted(UNMETERED_FEATURES))
                )
        return value

    @property
    def unmetered(self) -> frozenset[str]:
        """The routes and features ``--allow-unmetered`` relays without a record."""
        return frozenset(items(self.allow_unmetered))
