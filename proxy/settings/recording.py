"""The options of what is recorded and where it goes: the journal and its durability, the
PostgreSQL ledger, the exporters (CloudEvents, JSON lines, OTLP metrics), the shutdown
drain and the reconciliation against the engine's counters."""

from __future__ import annotations

from pydantic import BaseModel, Field

from proxy.settings.choices import Durability, default_journal_path


class RecordingOptions(BaseModel):
    """The journal, the ledger, the exporters and reconciliation."""

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
