"""The usage record: one per upstream request that reported usage (schema version 1).

Records are what billing consumes; see docs/metering.md for the field reference.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1
# Record ids are uuid5(RECORD_NAMESPACE, request id): the same request id always yields
# the same record id, so every sink can deduplicate redeliveries.
RECORD_NAMESPACE = uuid.UUID("6f0c8d52-3a4e-5b8f-9c1d-2e7a4b6c8d90")


def record_id_for(request_id: str) -> str:
    return str(uuid.uuid5(RECORD_NAMESPACE, request_id))


class UsageRecord(BaseModel):
    """A metered request. ``*_billed`` is what the tenant pays for."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = SCHEMA_VERSION
    record_id: str
    request_id: str
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
    latency_ms: float
    instance: str

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str | bytes) -> UsageRecord:
        return cls.model_validate_json(text)


OPERATIONS = {
    "/score": "score",
    "/v1/score": "score",
    "/rerank": "rerank",
    "/v1/rerank": "rerank",
    "/v2/rerank": "rerank",
    "/v1/embeddings": "embeddings",
    "/v2/embed": "embeddings",
    "/classify": "classify",
    "/v1/classify": "classify",
    "/pooling": "pooling",
    "/v1/completions": "completions",
    "/v1/chat/completions": "chat",
}
