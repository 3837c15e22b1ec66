"""CloudEvents export to a local receiver: event shape, batching, outage and recovery."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from proxy.ledger.journal import Journal
from proxy.ledger.outbox import Outbox
from proxy.ledger.records import Units, UsageRecord
from proxy.ledger.sinks.cloudevents import BATCH_CONTENT_TYPE, CloudEventsSink, usage_event
from tests.support.receivers import Receiver, StrictReceiver
from tests.support.records import make_record


async def test_events_shape_and_exactly_once_after_outage(
    aiohttp_server: Any, tmp_path: Path
) -> None:
    """Receiver down under load, then up: every record arrives, none twice (by id)."""
    receiver = Receiver()
    server = await aiohttp_server(receiver.app())
    journal = Journal(tmp_path / "j.sqlite")
    await journal.open()
    sink = CloudEventsSink(str(server.make_url("/api/v1/events")))
    outbox = Outbox(
        journal, [sink], batch_size=25, min_backoff=0.05, max_backoff=0.2, poll_interval=0.05
    )
    receiver.failing = True
    await outbox.start()
    records = [make_record(i, tenant=f"t{i % 3}") for i in range(120)]
    await asyncio.gather(*(journal.append(r) for r in records))
    await asyncio.sleep(0.4)
    assert receiver.events == []
    assert outbox.state["cloudevents"].failures > 0
    receiver.failing = False
    for _ in range(100):
        if await journal.backlog("cloudevents") == 0:
            break
        await asyncio.sleep(0.05)
    assert await outbox.drain(5) == {"cloudevents": 0}
    await journal.close()
    ids = [e["id"] for e in receiver.events]
    assert sorted(ids) == sorted(r.record_id for r in records)
    assert receiver.content_types == {BATCH_CONTENT_TYPE}
    event = receiver.events[0]
    assert event["specversion"] == "1.0"
    assert event["subject"] == "t0"
    assert event["source"] == "vllm-usage-proxy/test"
    assert event["time"].endswith("Z")
    assert event["data"]["prompt_tokens"] == 36
    assert event["data"]["prompt_tokens_reported"] == 57
    assert event["data"]["verdict"] == "corrected"


async def test_retry_after_is_honoured(aiohttp_server: Any, tmp_path: Path) -> None:
    """429 with Retry-After: the sink waits what the receiver asked, then delivers."""
    receiver = StrictReceiver("t")
    receiver.throttle = "1"
    server = await aiohttp_server(receiver.app())
    journal = Journal(tmp_path / "j.sqlite")
    await journal.open()
    sink = CloudEventsSink(
        str(server.make_url("/api/v1/events")), headers={"Authorization": "Bearer t"}
    )
    outbox = Outbox(journal, [sink], min_backoff=0.01, max_backoff=0.05, poll_interval=0.05)
    await outbox.start()
    await journal.append(make_record(1))
    for _ in range(100):  # the first attempt (a loaded machine may take a while to make it)
        if outbox.state["cloudevents"].backoff > 0:
            break
        await asyncio.sleep(0.05)
    assert receiver.events == []
    assert 0.9 <= outbox.state["cloudevents"].backoff <= 1.0
    for _ in range(60):
        if receiver.events:
            break
        await asyncio.sleep(0.05)
    assert len(receiver.events) == 1
    await outbox.drain(2)
    await journal.close()


def test_every_unit_is_a_numeric_property_of_the_one_event() -> None:
    """A record is one event; each unit is a property a SUM meter can read (0 where the
    engine did not report it), and ``units`` names the ones it did report."""
    base = make_record(1).model_dump(exclude={"record_id", "schema_version", "units"})
    cached = UsageRecord(**base, units=Units(cached_prompt_tokens=32))
    data = usage_event(cached)["data"]
    assert (data["prompt_tokens"], data["cached_prompt_tokens"], data["audio_seconds"]) == (
        36,
        32,
        0,
    )
    assert data["units"] == ["cached_prompt_tokens", "prompt_tokens"]
    audio = UsageRecord(
        **{**base, "prompt_tokens_reported": None, "prompt_tokens_billed": None},
        units=Units(audio_seconds=7),
    )
    event = usage_event(audio)
    assert event["id"] == audio.record_id
    assert (event["data"]["audio_seconds"], event["data"]["units"]) == (7, ["audio_seconds"])
    assert event["data"]["prompt_tokens"] is None


def test_a_traced_record_carries_the_distributed_tracing_extension() -> None:
    """A record with a trace is an event with the extension's ``traceparent`` attribute
    (and its trace id in ``data``); one without (schema 3 and older) has neither."""
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    traced = make_record(1).model_copy(
        update={"trace_id": traceparent[3:35], "traceparent": traceparent}
    )
    event = usage_event(traced)
    assert (event["traceparent"], event["data"]["trace_id"]) == (traceparent, traced.trace_id)
    untraced = usage_event(make_record(2))
    assert "traceparent" not in untraced
    assert untraced["data"]["trace_id"] is None
