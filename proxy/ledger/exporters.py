"""The exporters the settings configure: PostgreSQL ledger, CloudEvents, JSON lines."""

from __future__ import annotations

from proxy.ledger.sinks import Sink
from proxy.ledger.sinks.cloudevents import CloudEventsSink
from proxy.ledger.sinks.jsonl import JsonLinesSink
from proxy.settings import Settings


def build_sinks(settings: Settings) -> list[Sink]:
    sinks: list[Sink] = []
    if settings.ledger_dsn:
        from proxy.ledger.sinks.postgres import PostgresLedger  # asyncpg only with a ledger

        sinks.append(PostgresLedger(settings.ledger_dsn))
    if settings.cloudevents_url:
        sinks.append(
            CloudEventsSink(settings.cloudevents_url, headers=settings.cloudevents_headers)
        )
    if settings.jsonl:
        sinks.append(JsonLinesSink(settings.jsonl))
    return sinks
