"""Metering: tenant attribution, usage records into the journal, and the exporters.

Owns the journal, the outbox and their lifetimes (one cleanup_ctx). Recording never fails
a client request: a record that cannot be journaled is logged, counted and flagged on the
response (``x-usage-record: failed``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import structlog
from aiohttp import web

from proxy.journal import Journal, JournalError
from proxy.metrics import METRICS, Metrics
from proxy.outbox import Outbox
from proxy.records import OPERATIONS, SCHEMA_VERSION, UsageRecord, new_record_id
from proxy.settings import Durability, Settings
from proxy.sinks import Sink
from proxy.tenancy import Attribution, Refusal, TenantResolver, load_api_keys
from proxy.upstream import error_response, unauthorized

if TYPE_CHECKING:
    from proxy.settler import Settler

log = structlog.get_logger("proxy.metering")
T = TypeVar("T")

HEADER_RECORD = "x-usage-record"
HEADER_RECORD_ID = "x-usage-record-id"
MAX_CLIENT_ID_CHARS = 200
# Paths that do no engine work and that probes must reach without a key.
OPEN_PATHS = frozenset({"/health", "/healthz", "/readyz", "/ping", "/version", "/metrics"})
WHO = web.RequestKey("who", Attribution)


def client_request_id(headers: Mapping[str, str]) -> str | None:
    """The client's ``X-Request-Id`` as an untrusted correlation field: printable ASCII
    only (anything else becomes ``?``), at most 200 characters. Never a record's key."""
    value = headers.get("X-Request-Id")
    if not value:
        return None
    cleaned = "".join(c if " " <= c <= "~" else "?" for c in value[:MAX_CLIENT_ID_CHARS])
    return cleaned


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
        self._exchanges: set[asyncio.Task[Any]] = set()
        self.settler: Settler | None = None

    async def shielded(self, work: Coroutine[Any, Any, T]) -> T:
        """Run one metered exchange so that a client hanging up (aiohttp cancelling the
        handler) cannot cancel it: the upstream answer is still read and recorded.

        The exchange is a task of its own whose outcome is handed to the caller through a
        plain future: a cancelled caller cancels only that future. (``asyncio.shield``
        does the same with two more callbacks per request.)"""
        loop = asyncio.get_running_loop()
        outcome: asyncio.Future[T] = loop.create_future()

        async def run() -> None:
            try:
                result = await work
            except asyncio.CancelledError:
                outcome.cancel()
                raise
            except BaseException as exc:
                if not outcome.done():
                    outcome.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise
            else:
                if not outcome.done():
                    outcome.set_result(result)
            finally:
                self._exchanges.discard(task)

        task = loop.create_task(run())
        self._exchanges.add(task)
        return await outcome

    async def finish_exchanges(self, timeout: float) -> None:
        """Shutdown: let exchanges whose client left finish recording, bounded."""
        if self._exchanges:
            await asyncio.wait(list(self._exchanges), timeout=timeout)

    def attribute(self, headers: Mapping[str, str]) -> Attribution | Refusal:
        return self.resolver.resolve(headers)

    def new_record(
        self,
        request: web.Request,
        operation: str | None = None,
        **fields: object,
    ) -> UsageRecord:
        """A record for one upstream exchange, with a fresh proxy-minted id."""
        who = request[WHO]
        # Built from values the proxy itself produced: skip re-validation on the hot path.
        return UsageRecord.model_construct(
            record_id=new_record_id(),
            client_request_id=client_request_id(request.headers),
            time=datetime.now(UTC),
            schema_version=SCHEMA_VERSION,
            tenant=who.tenant,
            key_hash=who.key_hash,
            endpoint=request.path,
            operation=operation or OPERATIONS.get(request.path, "other"),
            instance=self.settings.instance,
            **fields,  # type: ignore[arg-type]
        )

    async def record(self, record: UsageRecord) -> bool:
        """Journal a record; False (logged, counted) when it could not be journaled."""
        if self.journal is None:
            self._account(record)
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
        self._account(record)
        return True

    def _account(self, record: UsageRecord) -> None:
        if self.settler is not None:
            self.settler.account(record)

    def headers(self, record: UsageRecord, journaled: bool) -> dict[str, str]:
        out = {HEADER_RECORD_ID: record.record_id}
        if not journaled:
            out[HEADER_RECORD] = "failed"
        return out


METER = web.AppKey("meter", Meter)


@web.middleware
async def attribution(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Decide who pays before anything is forwarded; refuse what cannot be attributed.

    Headers only: bodies are never touched here.
    """
    if request.path in OPEN_PATHS:
        return await handler(request)
    who = request.app[METER].attribute(request.headers)
    if isinstance(who, Refusal):
        metrics = request.app[METRICS]
        metrics.refused.labels(str(who.status)).inc()
        log.warning("request_refused", path=request.path, status=who.status, reason=who.message)
        if who.status == 401:
            return unauthorized()
        return error_response(who.status, who.message)
    request[WHO] = who
    return await handler(request)


def build_sinks(settings: Settings) -> list[Sink]:
    from proxy.sinks.cloudevents import CloudEventsSink
    from proxy.sinks.jsonl import JsonLinesSink
    from proxy.sinks.postgres import PostgresLedger

    sinks: list[Sink] = []
    if settings.ledger_dsn:
        sinks.append(PostgresLedger(settings.ledger_dsn))
    if settings.cloudevents_url:
        sinks.append(
            CloudEventsSink(settings.cloudevents_url, headers=settings.cloudevents_headers)
        )
    if settings.jsonl:
        sinks.append(JsonLinesSink(settings.jsonl))
    return sinks


def build_resolver(settings: Settings) -> TenantResolver:
    keys = load_api_keys(Path(settings.api_keys)) if settings.api_keys else {}
    if settings.api_keys and not keys:
        raise ValueError(f"--api-keys {settings.api_keys} lists no keys")
    return TenantResolver(
        header=settings.tenant_header, key_tenants=keys, allow_anonymous=settings.allow_anonymous
    )


def meter_context(
    settings: Settings, sinks: list[Sink] | None = None
) -> Callable[[web.Application], AsyncIterator[None]]:
    """cleanup_ctx: open the journal, start exporters; on shutdown drain, then close."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        resolver = build_resolver(settings)
        app[METRICS].trusted_tenants = resolver.key_tenants
        if not settings.metering:
            app[METER] = Meter(settings, None, resolver, metrics=app[METRICS])
            yield
            return
        journal = Journal(
            Path(settings.journal),
            sync=settings.durability is Durability.SYNC,
            commit_timeout=settings.journal_commit_timeout,
            commit_interval=settings.commit_interval,
            on_replaced=lambda carried: app[METRICS].journal_replaced.inc(),
        )
        await journal.open()
        metrics = app[METRICS]
        metrics.journal_ready.set_function(lambda: float(journal.healthy))
        outbox = Outbox(
            journal,
            build_sinks(settings) if sinks is None else sinks,
            metrics=metrics,
            retention=settings.journal_retention * 3600,
        )
        await outbox.start()
        meter = app[METER] = Meter(settings, journal, resolver, outbox, metrics=metrics)
        log.info(
            "metering",
            journal=settings.journal,
            durability=settings.durability.value,
            sinks=[s.name for s in outbox.sinks],
        )
        yield
        await meter.finish_exchanges(settings.drain_timeout)
        await outbox.drain(settings.drain_timeout)
        await journal.close()

    return ctx
