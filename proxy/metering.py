"""Metering: tenant attribution, usage records into the journal, and the exporters.

Owns the journal, the outbox and their lifetimes (one cleanup_ctx). Recording never fails
a client request: a record that cannot be journaled is logged, counted and flagged on the
response (``x-usage-record: failed``).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import cast

import structlog
from aiohttp import web

from proxy.journal import Journal, JournalError
from proxy.metrics import METRICS, Metrics
from proxy.outbox import Outbox
from proxy.records import OPERATIONS, UsageRecord, record_id_for
from proxy.settings import Durability, Settings
from proxy.sinks import Sink
from proxy.tenancy import Attribution, Source, TenantResolver, load_api_keys

log = structlog.get_logger("proxy.metering")

HEADER_RECORD = "x-usage-record"
HEADER_LITELLM = "x-litellm-total-tokens"


class Meter:
    """What request handlers use: attribution, request ids, and ``record``."""

    def __init__(
        self,
        settings: Settings,
        journal: Journal | None,
        resolver: TenantResolver,
        outbox: Outbox | None = None,
        *,
        metrics: Metrics | None = None,
    ) -> None:
        self.settings = settings
        self.journal = journal
        self.resolver = resolver
        self.outbox = outbox
        self.metrics = metrics
        self.failed = 0

    def attribute(self, headers: Mapping[str, str]) -> Attribution:
        return self.resolver.resolve(headers)

    @staticmethod
    def request_id(headers: Mapping[str, str]) -> str:
        return headers.get("X-Request-Id") or uuid.uuid4().hex

    def new_record(
        self, request_id: str, who: Attribution, endpoint: str, **fields: object
    ) -> UsageRecord:
        # Built from values the proxy itself produced: skip re-validation on the hot path.
        return UsageRecord.model_construct(
            record_id=record_id_for(request_id),
            request_id=request_id,
            tenant=who.tenant,
            key_hash=who.key_hash,
            endpoint=endpoint,
            operation=OPERATIONS.get(endpoint, "other"),
            instance=self.settings.instance,
            **fields,  # type: ignore[arg-type]
        )

    async def record(self, record: UsageRecord) -> bool:
        """Journal a record; False (logged, counted) when it could not be journaled."""
        if self.journal is None:
            return True
        try:
            await self.journal.append(record)
        except JournalError as exc:
            self.failed += 1
            if self.metrics:
                self.metrics.journal_failures.inc()
            log.error(
                "record_not_journaled",
                record_id=record.record_id,
                error=str(exc),
                tenant=record.tenant,
                prompt_tokens_billed=record.prompt_tokens_billed,
            )
            return False
        return True

    def headers(self, journaled: bool, billed_total: int | None) -> dict[str, str]:
        out = {} if journaled else {HEADER_RECORD: "failed"}
        if self.settings.litellm_header and billed_total is not None:
            out[HEADER_LITELLM] = str(billed_total)
        return out


METER = web.AppKey("meter", Meter)


def build_sinks(settings: Settings) -> list[Sink]:
    from proxy.sinks.cloudevents import CloudEventsSink
    from proxy.sinks.jsonl import JsonLinesSink
    from proxy.sinks.postgres import PostgresLedger

    sinks: list[Sink] = []
    if settings.ledger_dsn:
        sinks.append(PostgresLedger(settings.ledger_dsn))
    if settings.cloudevents_url:
        sinks.append(CloudEventsSink(settings.cloudevents_url))
    if settings.jsonl:
        sinks.append(JsonLinesSink(settings.jsonl))
    return sinks


def build_resolver(settings: Settings) -> TenantResolver:
    keys = load_api_keys(Path(settings.api_keys)) if settings.api_keys else {}
    order = cast(list[Source], settings.tenant_order.split(","))
    return TenantResolver(header=settings.tenant_header, key_tenants=keys, order=order)


def meter_context(
    settings: Settings, sinks: list[Sink] | None = None
) -> Callable[[web.Application], AsyncIterator[None]]:
    """cleanup_ctx: open the journal, start exporters; on shutdown drain, then close."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        resolver = build_resolver(settings)
        if not settings.metering:
            app[METER] = Meter(settings, None, resolver, metrics=app[METRICS])
            yield
            return
        journal = Journal(Path(settings.journal), sync=settings.durability is Durability.SYNC)
        await journal.open()
        metrics = app[METRICS]
        outbox = Outbox(
            journal,
            build_sinks(settings) if sinks is None else sinks,
            metrics=metrics,
            retention=settings.journal_retention * 3600,
        )
        await outbox.start()
        app[METER] = Meter(settings, journal, resolver, outbox, metrics=metrics)
        log.info(
            "metering",
            journal=settings.journal,
            durability=settings.durability.value,
            sinks=[s.name for s in outbox.sinks],
        )
        yield
        await outbox.drain(settings.drain_timeout)
        await journal.close()

    return ctx
