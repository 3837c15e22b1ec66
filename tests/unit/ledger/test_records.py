"""The usage record: typed at construction, minted ids, read back as written."""

from __future__ import annotations

import pytest

from proxy.ledger.records import SCHEMA_VERSION, UsageRecord, new_record_id
from tests.support.records import make_record


def test_record_ids_are_unique_and_time_ordered() -> None:
    """Each exchange gets a fresh UUIDv7; later ids sort after earlier ones."""
    ids = [new_record_id() for _ in range(200)]
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
    assert make_record(1).record_id != make_record(1).record_id


def test_a_record_reads_back_as_it_was_written() -> None:
    """What the journal stores (``to_json``) is the record ``from_json`` gives back."""
    record = make_record(7, tenant="beta", reported=57, billed=36)
    again = UsageRecord.from_json(record.to_json())
    assert again == record
    assert again.schema_version == SCHEMA_VERSION


def test_a_misspelt_field_is_refused() -> None:
    """A typo in a billing field is an error at construction, never a silent null."""
    fields = make_record(1).model_dump()
    fields["prompt_token_billed"] = fields.pop("prompt_tokens_billed")
    with pytest.raises(ValueError, match="prompt_token_billed"):
        UsageRecord(**fields)


def test_a_record_cannot_be_changed_after_it_is_built() -> None:
    """Records are frozen: what was journalled is what is exported."""
    record = make_record(1)
    with pytest.raises(ValueError, match="frozen"):
        record.prompt_tokens_billed = 0  # type: ignore[misc]
