"""The usage record: one per upstream exchange that reported usage (schema version 4).

Records are what billing consumes; see docs/metering.md for the field reference and the
migrations from versions 1 to 3. Version 3 adds ``units``: what was billed in each unit
the engine reported. Version 4 adds the W3C trace the request was sent upstream in
(``trace_id``, ``traceparent``), where a billing dispute starts. Older records read on
unchanged: their ``units`` are their billed tokens, their trace is unknown (null).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import uuid6
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    StringConstraints,
    model_validator,
)

from proxy.accounting.units import Quantities

SCHEMA_VERSION = 4


def new_record_id() -> str:
    """A fresh, time-ordered record id (UUIDv7), minted by the proxy for each exchange.

    Never derived from anything the client sends: a repeated client id must not merge or
    drop records. Sinks deduplicate redeliveries of the same record on this id.
    """
    return str(uuid6.uuid7())


class Units(BaseModel):
    """What was billed in each unit the engine reported; ``None`` is a unit it did not
    report (never inferred, never zero for "unknown").

    A typed structure, not a free-form mapping: a misspelt or negative unit is refused. A
    new unit is a new optional field here; the journal stores records as JSON and the
    PostgreSQL ledger stores ``units`` as one ``jsonb`` column, so adding one needs no
    migration of either.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    prompt_tokens: NonNegativeInt | None = None
    completion_tokens: NonNegativeInt | None = None
    # Prompt tokens served from the prefix cache, as vLLM reported them
    # (prompt_tokens_details.cached_tokens, input_tokens_details.cached_tokens,
    # cache_read_input_tokens). Part of prompt_tokens, not in addition to them.
    cached_prompt_tokens: NonNegativeInt | None = None
    # Seconds of audio, as vLLM reported them (usage {"type": "duration", "seconds": N}):
    # whole seconds, rounded up by vLLM (TranscriptionUsageAudio.seconds is an int).
    audio_seconds: NonNegativeInt | None = None

    def reported(self) -> dict[str, int]:
        """The units the engine reported, by name."""
        return {k: v for k, v in self.model_dump().items() if v is not None}

    def quantities(self) -> Quantities:
        """What was billed per unit, as settlement, the report, the spend metrics and the
        limits price it (a unit the engine did not report is zero)."""
        return Quantities(
            prompt_tokens=self.prompt_tokens or 0,
            completion_tokens=self.completion_tokens or 0,
            cached_prompt_tokens=self.cached_prompt_tokens or 0,
            audio_seconds=self.audio_seconds or 0,
        )


# W3C Trace Context: a trace id, and the version-00 traceparent that carries it.
TraceId = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")]
Traceparent = Annotated[
    str, StringConstraints(pattern=r"^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
]

# Units whose value the record also carries as a v2 ``*_billed`` field.
TOKEN_UNITS = {
    "prompt_tokens": "prompt_tokens_billed",
    "completion_tokens": "completion_tokens_billed",
}


class UsageRecord(BaseModel):
    """A metered request. ``*_billed`` is what the tenant pays for."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = SCHEMA_VERSION
    record_id: str = Field(default_factory=new_record_id)
    client_request_id: str | None = None
    time: datetime = Field(default_factory=lambda: datetime.now(UTC))
    tenant: str
    key_hash: str | None = None
    model: str | None = None
    endpoint: str
    operation: str
    upstream_version: str | None = None
    prompt_tokens_reported: int | None = None
    prompt_tokens_billed: int | None = None
    completion_tokens_reported: int | None = None
    completion_tokens_billed: int | None = None
    verdict: str | None = None
    m: int | None = None
    n: int | None = None
    status: int
    aborted: bool = False
    latency_ms: float
    instance: str
    units: Units = Field(default_factory=Units)
    # The trace the request was sent upstream in (its traceparent header; the proxy's own
    # when the client sent none it could continue); null in records before version 4.
    trace_id: TraceId | None = None
    traceparent: Traceparent | None = None

    @model_validator(mode="before")
    @classmethod
    def _token_units(cls, data: Any) -> Any:
        """``units`` holds the billed tokens too, always equal to ``*_billed``: filled from
        them when absent (v1/v2 records, callers that bill tokens only), refused when they
        disagree."""
        if not isinstance(data, dict):
            return data
        given = data.get("units")
        units = dict(given.model_dump() if isinstance(given, Units) else given or {})
        for unit, billed in TOKEN_UNITS.items():
            if units.get(unit) is None:
                units[unit] = data.get(billed)
        return {**data, "units": units}

    @model_validator(mode="after")
    def _units_agree(self) -> UsageRecord:
        for unit, billed in TOKEN_UNITS.items():
            if getattr(self.units, unit) != getattr(self, billed):
                raise ValueError(f"units.{unit} is not {billed}")
        return self

    @model_validator(mode="after")
    def _trace_agrees(self) -> UsageRecord:
        """The traceparent carries the trace id: both or neither, never two traces."""
        carried = self.traceparent[3:35] if self.traceparent else None
        if carried != self.trace_id:
            raise ValueError("traceparent does not carry trace_id")
        return self

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str | bytes) -> UsageRecord:
        return cls.model_validate_json(text)
