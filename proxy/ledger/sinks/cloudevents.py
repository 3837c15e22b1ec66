"""CloudEvents 1.0 over HTTP in batch mode, as OpenMeter ingests them.

One event per record: ``id`` = record id (deterministic), ``subject`` = tenant, ``type``
``vllm-usage-proxy.wire.usage``; ``data`` holds tokens, model, endpoint and verdict, and one
property per billing unit (``cached_prompt_tokens``, ``audio_seconds``).

Units are properties of the one event, not one event type per unit: an OpenMeter meter is
an event type plus a ``valueProperty``, so one SUM meter per unit (``$.audio_seconds``)
over the one type aggregates as cleanly, while the record stays one event with one
deterministic id (OpenMeter dedupes on id and source; splitting a record into several
events would need derived ids and could deliver half a record). The units added in schema
version 3 are always numbers (0 where the engine did not report that unit) so a SUM meter
never meets a missing value; ``units`` lists the ones the engine did report. A record of
schema version 4 carries its trace as the distributed-tracing extension's ``traceparent``
attribute (and ``trace_id`` in ``data``, for meters that group by it).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import aiohttp

from proxy.accounting.units import Unit
from proxy.ledger.records import UsageRecord
from proxy.ledger.sinks import PermanentDeliveryError, RetryLater
from proxy.ledger.windows import Entry, SettledWindow

EVENT_TYPE = "vllm-usage-proxy.wire.usage"
WINDOW_EVENT_TYPE = "vllm-usage-proxy.reconciliation"
BATCH_CONTENT_TYPE = "application/cloudevents-batch+json"


def to_event(record: Entry) -> dict[str, Any]:
    if isinstance(record, SettledWindow):
        return window_event(record)
    return usage_event(record)


def _event(
    kind: str, event_id: str, instance: str, subject: str, time: datetime, data: Any
) -> dict[str, Any]:
    """The CloudEvents 1.0 envelope every event of this proxy has."""
    return {
        "specversion": "1.0",
        "type": kind,
        "id": event_id,
        "source": f"vllm-usage-proxy/{instance}",
        "subject": subject,
        "time": time.isoformat().replace("+00:00", "Z"),
        "datacontenttype": "application/json",
        "data": data,
    }


def window_event(window: SettledWindow) -> dict[str, Any]:
    """One reconciliation window: subject is the upstream, data the whole window."""
    data = window.model_dump(mode="json", exclude={"window_id", "instance", "kind"})
    return _event(
        WINDOW_EVENT_TYPE, window.window_id, window.instance, window.upstream, window.end, data
    )


def usage_event(record: UsageRecord) -> dict[str, Any]:
    """One usage record; with the CloudEvents distributed-tracing extension's
    ``traceparent`` (the trace the request was sent upstream in) when the record has one."""
    event = _event(
        EVENT_TYPE,
        record.record_id,
        record.instance,
        record.tenant,
        record.time,
        {
            "prompt_tokens": record.prompt_tokens_billed,
            "completion_tokens": record.completion_tokens_billed,
            "prompt_tokens_reported": record.prompt_tokens_reported,
            Unit.CACHED.value: record.units.cached_prompt_tokens or 0,
            Unit.AUDIO.value: record.units.audio_seconds or 0,
            "units": sorted(record.units.reported()),
            "model": record.model,
            "endpoint": record.endpoint,
            "operation": record.operation,
            "verdict": record.verdict,
            "key_hash": record.key_hash,
            "status": record.status,
            "aborted": record.aborted,
            "client_request_id": record.client_request_id,
            "trace_id": record.trace_id,
        },
    )
    if record.traceparent is not None:
        event["traceparent"] = record.traceparent
    return event


def retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    if value.strip().isdigit():
        return float(value.strip())
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max((moment - datetime.now(UTC)).total_seconds(), 0.0)


def is_permanent(status: int) -> bool:
    """A 4xx about the events themselves. 401/403 (credentials), 408 and 429 (load) are
    the receiver's state, not the records': those are retried."""
    return 400 <= status < 500 and status not in (401, 403, 404, 408, 429)


class CloudEventsSink:
    def __init__(self, url: str, *, timeout: float = 10.0, headers: dict[str, str] | None = None):
        self.url = url
        self.name = "cloudevents"
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._headers = headers or {}
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=self._timeout)

    async def deliver(self, records: Sequence[Entry]) -> None:
        assert self._session is not None
        body = json.dumps([to_event(r) for r in records])
        headers = {"Content-Type": BATCH_CONTENT_TYPE, **self._headers}
        async with self._session.post(self.url, data=body, headers=headers) as response:
            if response.status < 300:
                return
            text = (await response.text(errors="replace"))[:300]
            message = f"cloudevents receiver answered {response.status}: {text}"
            if is_permanent(response.status):
                raise PermanentDeliveryError(message)
            wait = retry_after(response.headers.get("Retry-After"))
            if wait is not None:
                raise RetryLater(message, wait)
            raise RuntimeError(message)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
