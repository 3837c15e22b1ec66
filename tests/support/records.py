"""Usage records for tests: one made to order, and those a journal file holds."""

from __future__ import annotations

import uuid
from pathlib import Path

from proxy.ledger.journal_files import read_journal
from proxy.ledger.records import UsageRecord


def make_record(i: int, tenant: str = "acme", reported: int = 57, billed: int = 36) -> UsageRecord:
    """A rerank record of tenant ``tenant`` (3 documents, corrected), a fresh id each call."""
    return UsageRecord(
        client_request_id=f"req-{uuid.uuid4().hex}-{i}",
        tenant=tenant,
        model="minilm",
        endpoint="/rerank",
        operation="rerank",
        prompt_tokens_reported=reported,
        prompt_tokens_billed=billed,
        verdict="corrected",
        m=1,
        n=3,
        status=200,
        latency_ms=1.5,
        instance="test",
    )


def journal_records(path: Path) -> list[UsageRecord]:
    """The usage records a journal file holds, in the order they were appended."""
    return [UsageRecord.from_json(body) for body in read_journal(path)]
