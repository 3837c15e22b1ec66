"""The JSON lines sink: one line per record, appended in order, its directory made."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.ledger.records import UsageRecord
from proxy.ledger.sinks.jsonl import JsonLinesSink
from tests.support.records import make_record


async def test_records_are_appended_one_line_each(tmp_path: Path) -> None:
    """Two deliveries append to the same file; each line is one record, in order."""
    target = tmp_path / "deep" / "out.jsonl"
    sink = JsonLinesSink(str(target))
    await sink.start()
    first, second = [make_record(0), make_record(1)], [make_record(2)]
    await sink.deliver(first)
    await sink.deliver(second)
    await sink.close()
    lines = target.read_text().splitlines()
    assert [UsageRecord.from_json(line) for line in lines] == [*first, *second]
    assert sink.name == f"jsonl:{target}"


async def test_dash_writes_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    """``-`` is standard output, nothing is created on disk."""
    sink = JsonLinesSink("-")
    await sink.start()
    record = make_record(0)
    await sink.deliver([record])
    assert UsageRecord.from_json(capsys.readouterr().out.strip()) == record


async def test_lines_carry_the_units(tmp_path: Path) -> None:
    """Each line holds the record's ``units``: only the units the engine reported."""
    import json

    from proxy.ledger.records import Units

    base = make_record(0).model_dump(exclude={"record_id", "units"})
    audio = UsageRecord(
        **{**base, "prompt_tokens_reported": None, "prompt_tokens_billed": None},
        units=Units(audio_seconds=7),
    )
    target = tmp_path / "out.jsonl"
    sink = JsonLinesSink(str(target))
    await sink.start()
    await sink.deliver([audio])
    line = json.loads(target.read_text())
    assert line["schema_version"] == 4
    assert {k: v for k, v in line["units"].items() if v is not None} == {"audio_seconds": 7}
