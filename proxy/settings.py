"""Configuration: one pydantic model fed by CLI flags, environment variables and a file,
each through pydantic-settings' own source (CLI, environment, YAML or TOML); the model is
the one list of options, their flags, their ``--help`` and the README table.

Precedence: command-line flag > ``USAGE_PROXY_*`` environment variable > config file
(YAML or TOML, ``--config`` / ``USAGE_PROXY_CONFIG``) > default.
"""

from __future__ import annotations

import enum
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Literal
from urllib.parse import parse_qs

import yaml
from pydantic import (
    AnyHttpUrl,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
)
from pydantic_settings import (
    BaseSettings,
    CliSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
    YamlConfigSettingsSource,
)

from proxy.accounting.dispatch import UNMETERED_FEATURES
from proxy.accounting.types import Family

ENV_PREFIX = "USAGE_PROXY_"


# Not flags: structured (models) or secret (headers, the salt key: argv is visible to every
# local user).
FILE_ONLY = frozenset({"models", "cloudevents_headers", "cache_salt_secret"})


def _items(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


class Mode(enum.StrEnum):
    REWRITE = "rewrite"
    ANNOTATE = "annotate"
    SHADOW = "shadow"


class CacheSalting(enum.StrEnum):
    TENANT = "tenant"
    OFF = "off"


class Durability(enum.StrEnum):
    SYNC = "sync"
    ASYNC = "async"


class EventLoop(enum.StrEnum):
    UVLOOP = "uvloop"
    ASYNCIO = "asyncio"


def default_journal_path() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "vllm-usage-proxy" / "journal.sqlite"


class ModelOverride(BaseModel):
    """Per-model knowledge that discovery cannot get from the upstream."""

    model_config = ConfigDict(extra="forbid")

    tokenizer: str | None = Field(
        None, description="Tokenizer directory or HF id in the local cache (default: root)."
    )
    family: Family | None = Field(
        None,
        description="Scoring family (default: config.json, corrected by the routes the "
        "server serves).",
    )
    template: Path | None = Field(
        None,
        description="The score template file the server was given as --chat-template "
        "(LLM rerankers such as Qwen3-Reranker); the proxy renders it as vLLM does.",
    )
    use_sep_token: bool | None = Field(
        None,
        description="An LLM reranker without a template: tokenize query and document as a "
        "pair (true) or joined (false); default as vLLM decides from the config.",
    )


class Settings(BaseSettings):
    """Every option of ``usage-proxy serve``."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid")
    config_file: ClassVar[Path | None] = None

    upstream: AnyHttpUrl = Field(
        description="Base URL of the vLLM server, e.g. http://127.0.0.1:8000."
    )
    host: str = Field("0.0.0.0", description="Address to listen on.")
    port: int = Field(8080, ge=1, le=65535, description="Port to listen on.")
    mode: Mode = Field(
        Mode.REWRITE,
        description="rewrite: usage as a fixed vLLM reports it; annotate: keep the reported "
        "usage and add engine_prompt_tokens/usage_verdict; shadow: body untouched. "
        "All modes add x-usage-* headers.",
    )
    connect_timeout: float = Field(10.0, gt=0, description="Seconds to connect to the upstream.")
    read_timeout: float = Field(
        600.0, gt=0, description="Seconds to wait for upstream headers or the next body chunk."
    )
    accounting_timeout: float = Field(
        5.0,
        gt=0,
        description="Seconds to wait for a recount after the upstream answered; "
        "past it the response is sent unaudited.",
    )
    max_body_bytes: int = Field(
        64 * 1024 * 1024, gt=0, description="Largest audited request body read into memory."
    )
    max_answer_bytes: int = Field(
        256 * 1024 * 1024,
        gt=0,
        description="Largest upstream answer (as sent, and decoded) read into memory to audit "
        "it (uncompressed metered answers: at most 8 MiB); a larger one is passed on as it "
        "arrives, a metered one billed from the usage at its end (its last 64 KiB held "
        "until then), anything else recorded invalid (nothing billed).",
    )
    max_inflight_body_bytes: int = Field(
        128 * 1024 * 1024,
        gt=0,
        description="Bytes of audited/metered request bodies held in memory at once (the "
        "proxy parses and counts them at a few times their size); past it, 503 with "
        "Retry-After. Size it with the memory limit: about 5 bytes of RSS per body byte.",
    )
    body_read_timeout: float = Field(
        30.0,
        gt=0,
        description="Seconds to receive a whole audited/metered request body; past it, 408.",
    )
    send_timeout: float = Field(
        30.0,
        gt=0,
        description="Seconds a client may go without accepting any byte of its answer (as "
        "nginx's send_timeout): one that reads nothing for this long, its connection's send "
        "buffer full, is disconnected, so it cannot hold an upstream connection or a held "
        "answer's memory. A metered answer is still read to its end and billed (aborted).",
    )
    keepalive_timeout: float = Field(
        75.0,
        gt=0,
        description="Seconds a client connection may stay without a complete request: an "
        "idle keep-alive connection, or one whose request headers have not all arrived, is "
        "closed after it (so slow-header clients cannot hold connections).",
    )
    max_connections: int = Field(
        4096,
        ge=1,
        description="Client connections open at once; beyond it a connection gets 503 and "
        "is closed (logged, counted), so a flood cannot exhaust file descriptors.",
    )
    upstream_connections: int = Field(
        256,
        ge=1,
        description="Most connections open to the upstream at once (requests beyond it "
        "wait for a free one), so slow clients cannot exhaust vLLM's connections.",
    )
    upstream_keepalive: float = Field(
        2.0,
        gt=0,
        description="Seconds an idle upstream connection is kept for reuse. Keep it below "
        "the upstream's own idle timeout (vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s): a "
        "request sent on a connection the upstream is closing gets 502.",
    )
    tenant_share: float = Field(
        0.25,
        gt=0,
        le=1,
        description="Share of --upstream-connections (requests in flight) and of "
        "--max-inflight-body-bytes kept for the other tenants: a tenant may use more while "
        "the rest is free, but a request that would take the last share from the others "
        "gets 429 with Retry-After (a tenant's lone request never does). Applies with "
        "--api-keys or --tenant-header; 1 turns it off.",
    )
    max_documents: int = Field(
        100_000,
        ge=1,
        description="Most documents (or queries) in one score/rerank request; above it "
        "the proxy answers 400 without forwarding.",
    )
    tokenizer_threads: int = Field(2, ge=1, description="Threads that run tokenization.")
    refresh_interval: float = Field(
        60.0, gt=0, description="Seconds between reads of upstream /version and /v1/models."
    )
    recount_fraction: float = Field(
        1.0,
        ge=0.0,
        le=1.0,
        description="Share of requests recounted in full once a model is trusted; the rest "
        "are judged by a shortcut (bi-encoders: the derivation from the reported count and "
        "the query length). Until then every request is recounted.",
    )
    upstream_transformers: Literal["auto", "4", "5"] = Field(
        "auto",
        description="The transformers major version the upstream counts with: auto is 4 "
        "up to vLLM 0.19.0 (which pin it below 5) and 5 from 0.19.1 (0.24 requires 5.5.3); "
        "set 4 for a 0.19.1 - 0.23 server installed with transformers 4.x. Some tokenizers "
        "(XLM-R) count differently.",
    )
    trust_after_recounts: int = Field(
        3,
        ge=1,
        description="Full recounts of a model (per release) that must agree with the upstream "
        "(exact or corrected) before --recount-fraction's shortcuts are used for it; one "
        "disagreement turns them off for that model.",
    )
    count_cache_size: int = Field(
        50_000,
        ge=0,
        description="Cached per-text token counts (0 disables; the least recently used go "
        "first, by generations). Texts up to 2,048 characters are kept as their own keys "
        "(at most 32 MiB of them), longer ones as a 16-byte digest.",
    )
    event_loop: EventLoop = Field(
        EventLoop.UVLOOP,
        description="The event loop the process serves on: uvloop (libuv's, the default) "
        "or asyncio (the standard library's, to fall back to).",
    )
    log_level: str = Field("info", description="debug, info, warning or error.")
    instance: str = Field(
        default_factory=socket.gethostname,
        description="Name of this proxy instance in usage records (default: host name).",
    )
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
        "(prompt_tokens, cached_prompt_tokens, completion_tokens, audio_seconds; LiteLLM's "
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
        "store reported while it was up.",
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
    journal: str = Field(
        default_factory=lambda: str(default_journal_path()),
        description="SQLite usage journal path; 'off' disables metering.",
    )
    journal_commit_timeout: float = Field(
        2.0,
        gt=0,
        description="Seconds a response waits for its record's commit (sync durability); "
        "past it the answer goes out with x-usage-record: failed and /readyz reports not ready.",
    )
    durability: Durability = Field(
        Durability.SYNC,
        description="sync: a record is committed before the response is released; async: "
        "released at once, committed by the next group commit (lower latency, a crash "
        "can lose the last records).",
    )
    commit_interval: float = Field(
        0.01,
        ge=0,
        le=1,
        description="async durability: records are committed at most this often (seconds), "
        "each time in one group; a crash can lose the records of the last interval. "
        "0: commit as soon as the writer is free.",
    )
    journal_retention: float = Field(
        168.0,
        ge=0,
        description="Hours to keep records every exporter has delivered (0: keep all). "
        "Without exporters the journal keeps everything.",
    )
    ledger_dsn: str | None = Field(
        None, description="PostgreSQL DSN of the usage ledger (postgresql://user@host/db)."
    )
    cloudevents_url: str | None = Field(
        None, description="HTTP endpoint for CloudEvents batches (e.g. OpenMeter /api/v1/events)."
    )
    jsonl: str | None = Field(None, description="Also export JSON lines to this file, or '-'.")
    otlp_metrics_endpoint: str | None = Field(
        None,
        description="OTLP/HTTP metrics endpoint (e.g. http://collector:4318/v1/metrics) to "
        "send the OpenTelemetry GenAI token-usage histogram gen_ai.client.token.usage to, "
        "one input and one output measurement per record. Unset: the OpenTelemetry SDK is "
        "not even imported and nothing is sent.",
    )
    otlp_export_interval: float = Field(
        60.0,
        gt=0,
        description="Seconds between exports to --otlp-metrics-endpoint (the last ones are "
        "sent at shutdown).",
    )
    drain_timeout: float = Field(
        10.0, ge=0, description="Seconds to keep delivering records on shutdown."
    )
    reconcile_interval: float = Field(
        15.0,
        ge=0,
        description="Seconds between readings of the upstream's token counters to reconcile "
        "the ledger against the engine (0 disables).",
    )
    reconcile_metrics_path: str = Field(
        "/metrics",
        description="Path of the upstream's Prometheus metrics (vllm:prompt_tokens_total).",
    )
    reconcile_shared_upstream: bool = Field(
        False,
        description="Other proxies send to the same vLLM: its counters then hold their "
        "requests too, so reconciliation claims no unbilled tokens (windows marked shared; "
        "the drift alert stays silent on them) and still proves that this proxy bills no "
        "more than the engine did (docs/metering.md, 'Several proxies in front of one vLLM').",
    )
    cloudevents_headers: dict[str, str] = Field(
        default_factory=dict,
        description="HTTP headers for the CloudEvents receiver, e.g. Authorization for "
        "OpenMeter (a JSON object in the environment, or a mapping in the config file; never "
        "a flag, so secrets stay out of argv; never logged or exported).",
    )
    admin_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="Serve /metrics, /healthz, /readyz on this port instead of the main one.",
    )
    admin_host: str = Field("0.0.0.0", description="Address for --admin-port.")
    metrics_tenant_label: bool = Field(
        False,
        description="Label token metrics by tenant (capped by --metrics-max-tenants); needs "
        "--admin-port, since /metrics on the main port needs no key.",
    )
    metrics_max_tenants: int = Field(
        100, ge=1, description="Distinct tenant label values before folding into 'other'."
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

    @field_validator("allow_unmetered")
    @classmethod
    def _known_unmetered(cls, value: str) -> str:
        for item in _items(value):
            if not item.startswith("/") and item not in UNMETERED_FEATURES:
                raise ValueError(
                    f"{item!r} is neither a path (starting with /) nor one of "
                    + ", ".join(sorted(UNMETERED_FEATURES))
                )
        return value

    @property
    def unmetered(self) -> frozenset[str]:
        """The routes and features ``--allow-unmetered`` relays without a record."""
        return frozenset(_items(self.allow_unmetered))

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        if value.lower() not in {"debug", "info", "warning", "error"}:
            raise ValueError("must be one of debug, info, warning, error")
        return value.lower()

    @property
    def metering(self) -> bool:
        return self.journal.lower() != "off"

    @property
    def upstream_base(self) -> str:
        return str(self.upstream).rstrip("/")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # A CLI source given to the constructor goes first (pydantic-settings puts it there).
        if cls.config_file is None:
            return init_settings, env_settings
        return init_settings, env_settings, _file_source(settings_cls, cls.config_file)


def _file_source(settings_cls: type[BaseSettings], path: Path) -> PydanticBaseSettingsSource:
    """pydantic-settings' TOML source for a ``.toml`` file, its YAML source otherwise."""
    if not path.is_file():
        raise ValueError(f"cannot read config file {path}: no such file")
    if path.suffix == ".toml":
        return _TomlFile(settings_cls, toml_file=path)
    return _YamlFile(settings_cls, yaml_file=path)


class _YamlFile(YamlConfigSettingsSource):
    def _read_file(self, file_path: Any) -> dict[str, Any]:
        return _option_names(file_path, super()._read_file)


class _TomlFile(TomlConfigSettingsSource):
    def _read_file(self, file_path: Any) -> dict[str, Any]:
        return _option_names(file_path, super()._read_file)


def _option_names(path: Path, read: Callable[[Path], Any]) -> dict[str, Any]:
    """A file's options, keyed as the fields (``read-timeout`` as a flag spells it is
    ``read_timeout``); every error names the file."""
    try:
        data = read(path)
    except OSError as exc:
        raise ValueError(f"cannot read config file {path}: {exc.strerror}") from exc
    except (ValueError, yaml.YAMLError) as exc:  # TOMLDecodeError is a ValueError
        raise ValueError(f"config file {path} is not valid: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"config file {path} must hold a mapping of option names to values")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def load_settings(
    cli: dict[str, Any],
    config_file: Path | None,
    *,
    flags: CliSettingsSource[Settings] | None = None,
) -> Settings:
    """Build settings from the ``serve`` flags (a pydantic-settings CLI source), or from
    CLI values given as a mapping (None means 'not given'), and an optional file."""
    given: dict[str, Any] = {k: v for k, v in cli.items() if v is not None}
    given["_cli_settings_source"] = flags  # BaseSettings' own argument, not a field

    class _Bound(Settings):
        config_file: ClassVar[Path | None] = None

    _Bound.config_file = config_file
    return _Bound(**given)


class Sources(BaseSettings):
    """The options ``usage-proxy report`` shares with ``serve``, read as ``serve`` reads
    them (flags > ``USAGE_PROXY_*`` environment > the ``--config`` file > default): where
    the records are and the limits file. Every other option of the file is ignored."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")
    config_file: ClassVar[Path | None] = None

    journal: str = Field(default_factory=lambda: str(default_journal_path()))
    journal_retention: float = Field(default=168.0, ge=0)
    ledger_dsn: str | None = None
    limits: Path | None = None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        if cls.config_file is None:
            return init_settings, env_settings
        return init_settings, env_settings, _file_source(settings_cls, cls.config_file)


def load_sources(config_file: Path | None) -> Sources:
    """The report's options from the environment and ``config_file`` (flags are the
    command's own, applied over these)."""

    class _Bound(Sources):
        config_file: ClassVar[Path | None] = None

    _Bound.config_file = config_file
    return _Bound()


def display_default(name: str) -> str:
    """A default as a person reads it (``--help`` and the README): never an internal."""
    field = Settings.model_fields[name]
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        return {
            "instance": "host name",
            "journal": "$XDG_STATE_HOME/vllm-usage-proxy/journal.sqlite",
        }.get(name, "{}")
    value = field.default
    shown = value.value if isinstance(value, enum.Enum) else value
    return "unset" if value is None or value == "" else str(shown)


def reference_table() -> str:
    """The configuration reference as a markdown table (README section; a test checks it)."""
    rows = ["| option | environment | default | meaning |", "|---|---|---|---|"]
    for name, field in Settings.model_fields.items():
        flag = "env/file only" if name in FILE_ONLY else ("`--" + name.replace("_", "-") + "`")
        default = display_default(name)
        if default not in ("required", "unset", "host name"):
            default = f"`{default}`"
        description = (field.description or "").replace("|", "\\|")
        rows.append(f"| {flag} | `{ENV_PREFIX}{name.upper()}` | {default} | {description} |")
    return "\n".join(rows) + "\n"
