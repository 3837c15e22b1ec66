"""The JSON lines sink: one line per record, appended in order, its directory made."""

from __future__ import annotations

import asyncio
import fcntl
import os
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


async def test_a_batch_waits_for_the_file_lock_another_process_holds(tmp_path: Path) -> None:
    """Two workers may export to one file: a batch is written only under an exclusive
    ``flock`` on it, so it waits while another holder (here the test, through its own
    open file) writes, and no line is split by another's."""
    target = tmp_path / "out.jsonl"
    target.write_text("")
    sink = JsonLinesSink(str(target))
    await sink.start()
    other = os.open(target, os.O_WRONLY | os.O_APPEND)  # another open file: another holder
    try:
        fcntl.flock(other, fcntl.LOCK_EX)
        record = make_record(0)
        delivery = asyncio.create_task(sink.deliver([record]))
        await asyncio.sleep(0.3)
        assert not delivery.done()
        assert target.read_text() == ""  # nothing written while the other holds the lock
        fcntl.flock(other, fcntl.LOCK_UN)
    finally:
        os.close(other)
    await asyncio.wait_for(delivery, 5)
    lines = target.read_text().splitlines()
    assert [UsageRecord.from_json(line) for line in lines] == [record]
