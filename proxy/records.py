"""The usage record: one per upstream exchange that reported usage (schema version 2).

Records are what billing consumes; see docs/metering.md for the field reference and the
migration from version 1.
"""

from __future__ import annotations

from datetime import UTC, datetime

import uuid6
from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 2
# The largest token count a record carries: every JSON parser reads it exactly and
# every sink column (bigint) holds it. Larger or non-integer usage is `invalid`.
MAX_TOKENS = 2**53 - 1


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
    # N conversations in one request, never streamed, one usage summing them (in vLLM
    # 0.32.0, not yet in 0.29.0)
    "/v1/chat/completions/batch": "chat",
    # Usage as input_tokens/output_tokens: in the answer, or streamed in message_delta
    # (Anthropic Messages) or the final response.completed event (Responses)
    "/v1/messages": "messages",
    "/v1/responses": "responses",
    # Structured decisions (vLLM 0.32.0): one usage summing the engine requests it made
    "/v1/systemone": "decisions",
}
