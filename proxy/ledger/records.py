"""The usage record: one per upstream exchange that reported usage (schema version 2).

Records are what billing consumes; see docs/metering.md for the field reference and the
migration from version 1.
"""

from __future__ import annotations

from datetime import UTC, datetime

import uuid6
from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 2


def new_record_id() -> str:
    """A fresh, time-ordered record id (UUIDv7), minted by the proxy for each exchange.

    Never derived from anything the client sends: a repeated client id must not merge or
    drop records. Sinks deduplicate redeliveries of the same record on this id.
    """
    return str(uuid6.uuid7())


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

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str | bytes) -> UsageRecord:
        return cls.model_validate_json(text)
