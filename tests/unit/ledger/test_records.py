"""The usage record: typed at construction, minted ids, read back as written."""

from __future__ import annotations

import pytest

from proxy.accounting.units import Quantities
from proxy.ledger.records import SCHEMA_VERSION, Units, UsageRecord, new_record_id
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


# A schema-version-2 record as the journal and JSONL sinks stored it (no units).
V2_BODY = (
    '{"schema_version":2,"record_id":"01920000-0000-7000-8000-000000000001",'
    '"client_request_id":null,"time":"2026-01-02T03:04:05Z","tenant":"acme","key_hash":null,'
    '"model":"minilm","endpoint":"/v1/chat/completions","operation":"chat",'
    '"upstream_version":"0.11.0","prompt_tokens_reported":12,"prompt_tokens_billed":11,'
    '"completion_tokens_reported":5,"completion_tokens_billed":5,"verdict":"corrected",'
    '"m":null,"n":1,"status":200,"aborted":false,"latency_ms":3.0,"instance":"i"}'
)


def test_a_version_2_record_reads_on_with_its_tokens_as_units() -> None:
    """A stored v2 record keeps its version and fields; its units are its billed tokens."""
    record = UsageRecord.from_json(V2_BODY)
    assert record.schema_version == 2
    assert record.prompt_tokens_billed == 11
    assert record.units == Units(prompt_tokens=11, completion_tokens=5)
    assert record.units.reported() == {"prompt_tokens": 11, "completion_tokens": 5}
    assert UsageRecord.from_json(record.to_json()) == record


def test_units_carry_what_the_engine_reported_and_nothing_it_did_not() -> None:
    """Audio seconds and cached tokens travel in ``units``; an unreported unit stays None."""
    audio = make_record(1).model_copy(update={"prompt_tokens_billed": None})
    fields = {**audio.model_dump(), "prompt_tokens_reported": None}
    fields["units"] = {"audio_seconds": 7}
    record = UsageRecord(**fields)
    assert record.schema_version == SCHEMA_VERSION == 4
    assert record.units.reported() == {"audio_seconds": 7}
    assert UsageRecord.from_json(record.to_json()).units.audio_seconds == 7
    cached = make_record(2, billed=36).model_dump()
    cached["units"] = {"cached_prompt_tokens": 32}
    assert UsageRecord(**cached).units.reported() == {
        "prompt_tokens": 36,
        "cached_prompt_tokens": 32,
    }


def test_a_record_s_quantities_are_its_units_with_unreported_ones_zero() -> None:
    """What a record billed per unit, as every pricer reads it: each unit it carries,
    and zero for a unit the engine did not report (never None, never inferred)."""
    cached = make_record(2, billed=36).model_dump()
    cached["units"] = {"cached_prompt_tokens": 32, "audio_seconds": 7}
    assert UsageRecord(**cached).units.quantities() == Quantities(
        prompt_tokens=36, completion_tokens=0, cached_prompt_tokens=32, audio_seconds=7
    )
    assert Units().quantities() == Quantities()


def test_units_are_typed_and_agree_with_the_billed_tokens() -> None:
    """A misspelt or negative unit is refused, and so are token units that disagree with
    the ``*_billed`` fields billing has always read."""
    fields = make_record(1).model_dump()
    with pytest.raises(ValueError, match="audio_secs"):
        UsageRecord(**{**fields, "units": {"audio_secs": 3}})
    with pytest.raises(ValueError, match="greater than or equal"):
        UsageRecord(**{**fields, "units": {"cached_prompt_tokens": -1}})
    with pytest.raises(ValueError, match="prompt_tokens_billed"):
        UsageRecord(**{**fields, "units": {"prompt_tokens": 99}})


TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_version_3_record_reads_on_without_a_trace() -> None:
    """A stored v3 record (no trace fields) keeps its version; its trace is unknown."""
    fields = make_record(1).model_dump(mode="json", exclude={"trace_id", "traceparent"})
    record = UsageRecord.model_validate({**fields, "schema_version": 3})
    assert (record.schema_version, record.trace_id, record.traceparent) == (3, None, None)
    assert UsageRecord.from_json(record.to_json()) == record


@pytest.mark.parametrize(
    ("trace_id", "traceparent"),
    [
        ("4bf92f3577b34da6a3ce929d0e0e4736", None),
        (None, TRACEPARENT),
        ("0" * 32, TRACEPARENT),
        ("4BF92F3577B34DA6A3CE929D0E0E4736", TRACEPARENT.upper()),
        ("4bf92f3577b34da6a3ce929d0e0e4736", TRACEPARENT + "-x"),
    ],
)
def test_the_trace_id_is_the_one_its_traceparent_carries(
    trace_id: str | None, traceparent: str | None
) -> None:
    """Both or neither, lowercase version-00 form, one trace: never a record naming two."""
    with pytest.raises(ValueError, match="trace"):
        make_record(1).model_validate(
            {**make_record(1).model_dump(), "trace_id": trace_id, "traceparent": traceparent}
        )
