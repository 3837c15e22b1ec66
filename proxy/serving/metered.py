"""Metered pass-through for the other endpoints that report usage (embeddings, classify,
pooling, completions, chat, and ``/invocations`` bodies that vLLM dispatches to them): the
answer is vLLM's, the record is committed before the response (or the final ``[DONE]`` of
a stream) is released."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

import aiohttp
import structlog
from aiohttp import web
from multidict import CIMultiDictProxy

from proxy.accounting.audio import FEATURE_FIELDS, prepare_form
from proxy.accounting.dispatch import Prepared, prepare, takes_cache_salt
from proxy.accounting.operations import FORM_OPERATIONS, Operation
from proxy.ledger.recorder import Recorder
from proxy.ledger.records import Units
from proxy.metrics import Metrics
from proxy.serving.admission import Admission
from proxy.serving.bodies import off_loop
from proxy.serving.catalog import Catalog
from proxy.serving.downstream import (
    AnswerRoom,
    abort,
    client_left,
    pass_on,
    pass_on_then_settle,
    pass_on_unread,
    record_headers,
    send,
    write_now,
)
from proxy.serving.exchange import Billing, Exchange
from proxy.serving.isolation import SALT_HEADERS, CacheSalts, ResponseOwners
from proxy.serving.unmetered import Unmetered
from proxy.serving.upstream import (
    SESSION,
    UpstreamError,
    error_response,
    forward,
    read_answer,
    readable_body,
    reply_headers,
    response_headers,
    too_large,
    upstream_failure,
)
from proxy.settings import Settings
from proxy.wire.encoding import UnreadableBody, content_codings
from proxy.wire.jsonio import with_members
from proxy.wire.members import TopLevelMembers
from proxy.wire.sse import UsageScanner
from proxy.wire.usage import (
    NO_USAGE,
    Reading,
    read_usage,
    reading_of,
    reading_of_members,
    usage_in_metadata,
)

log = structlog.get_logger("proxy.serving.metered")


def unbillable_message(feature: str) -> str:
    """Why a feature whose answer does not show the engine work it makes (no usage, or a
    usage that leaves work out) is refused, and the opt-in that relays it."""
    return (
        f"{feature}: vLLM's answer does not show all the engine work it makes, so the "
        f"proxy cannot bill it; an operator may relay it unmetered with "
        f"--allow-unmetered {feature}"
    )


def feature_param(feature: str) -> str:
    """The request field a feature's refusal names (vLLM's ``param``)."""
    return FEATURE_FIELDS.get(feature, feature.partition(".")[2])


# Metered answers larger than this (below --max-answer-bytes) are not held either: they are
# passed on as they arrive and billed from the usage at their end, so a large batch of
# embeddings takes neither the proxy's memory nor the event loop's time to parse it
# (pydantic-core holds the GIL about 20 ms per 16 MB). Smaller ones are read whole, as a
# client reads them, and carry the x-usage-* headers.
HELD_ANSWER_BYTES = 8 * 1024 * 1024
# All the metered answers held whole at once: past it, one more is passed on the same way
# (billed from its end, without x-usage-* headers), so many clients fetching answers of a
# few MiB, or not reading them (for up to --send-timeout), cannot add up to gigabytes.
HELD_ANSWERS_TOTAL = 64 * 1024 * 1024


# The content type of a ``bytes`` embeddings or pooling answer (raw tensors).
TENSORS = "application/octet-stream"


class MeteredRelay:
    """The handler for the endpoints that report usage (and /invocations bodies that vLLM
    dispatches to them)."""

    def __init__(
        self,
        settings: Settings,
        catalog: Catalog,
        recorder: Recorder,
        metrics: Metrics,
        unmetered: Unmetered,
        owners: ResponseOwners,
        salts: CacheSalts | None,
        admission: Admission | None = None,
    ) -> None:
        self._base = settings.upstream_base
        self._admission = admission
        self._limit = settings.max_answer_bytes
        self._instance = settings.instance
        self._catalog = catalog
        self._recorder = recorder
        self._metrics = metrics
        self._unmetered = unmetered
        self._owners = owners
        self._salts = salts
        self._drop = SALT_HEADERS if salts is not None else frozenset()
        self.room = AnswerRoom(HELD_ANSWERS_TOTAL)

    async def __call__(self, exchange: Exchange) -> web.StreamResponse:
        body, task_of = exchange.body, self._catalog.task_of
        operation = exchange.route.operation
        if operation in FORM_OPERATIONS:  # multipart: read (and added to) off the loop
            kind, release = exchange.request.headers.get("Content-Type"), self._catalog.release
            prepared = await off_loop(prepare_form, body, operation, body, kind, release)
        else:
            prepared = await off_loop(prepare, body, exchange.path, body, task_of)
        return await self.relay(exchange, prepared)

    async def relay(self, exchange: Exchange, prepared: Prepared) -> web.StreamResponse:
        """Forward ``prepared`` and record the usage of a successful answer: refused for its
        fields, kept apart from other tenants (even when relayed unmetered), admitted."""
        if prepared.refusal is not None:
            return self._refuse(exchange, prepared.refusal.message, prepared.refusal.param)
        if prepared.unbillable is not None and prepared.unbillable not in self._unmetered.features:
            feature = prepared.unbillable
            return self._refuse(exchange, unbillable_message(feature), feature_param(feature))
        sent = await self._isolate(exchange, prepared)
        if isinstance(sent, web.Response):
            return sent
        if prepared.unbillable is not None:
            return await self._unbillable(exchange, sent, prepared.unbillable)
        if self._admission is not None:
            refusal = await self._admission.admit_metered(exchange, prepared)
            if refusal is not None:
                return refusal
        request = exchange.request
        reserved = 0
        try:
            async with forward(
                request.app[SESSION], self._base, request, sent, metered=True, drop=self._drop
            ) as upstream:
                if upstream.content_type == "text/event-stream":
                    return await self._stream(exchange, upstream, prepared)
                if upstream.content_type == TENSORS:
                    metadata = upstream.headers.get("metadata")
                    return await self._tensors(exchange, upstream, prepared, metadata)
                encoded = bool(content_codings(upstream.headers.get("Content-Encoding")))
                if encoded:  # held to be decoded, up to the limit
                    held = self._limit
                else:
                    most = min(self._limit, HELD_ANSWER_BYTES)
                    held = reserved = self.room.take(upstream.content_length, most)
                payload, whole = await read_answer(upstream, held)
                if not whole:
                    self.room.give(reserved)
                    reserved = 0
                    return await self._pass_on(exchange, prepared, upstream, payload, encoded)
                status, headers = upstream.status, upstream.headers
            reply = await self._whole(exchange, prepared, payload, status, headers)
            if reserved:  # written while its room is still taken
                await write_now(request, reply)
            return reply
        except UpstreamError as exc:
            return upstream_failure(self._metrics, exc)
        finally:
            self.room.give(reserved)

    async def _isolate(self, exchange: Exchange, prepared: Prepared) -> bytes | web.Response:
        """The body to send, with the members that keep tenants apart (a minted response id
        its tenant owns, the tenant's cache salt); or the refusal of a request that names
        another tenant's stored response (``proxy.serving.isolation``)."""
        tenant, members = exchange.who.tenant, dict[str, str]()
        if prepared.operation == Operation.RESPONSES:
            if prepared.previous_response_id is not None:
                refusal = await self._owners.refusal(prepared.previous_response_id, tenant)
                if refusal is not None:
                    return refusal
            members["request_id"] = response_id = self._owners.mint()
            await self._owners.claim(response_id, tenant)
        if self._salts is not None and takes_cache_salt(prepared.operation, self._catalog.release):
            members["cache_salt"] = self._salts.salt(tenant, prepared.cache_salt)
        if not members:
            return prepared.body
        try:
            return await off_loop(with_members, prepared.body, prepared.body, members)
        except ValueError:  # not a JSON object: vLLM answers it 400, nothing to keep apart
            return prepared.body

    async def _whole(
        self,
        exchange: Exchange,
        prepared: Prepared,
        payload: bytes,
        status: int,
        headers: CIMultiDictProxy[str],
    ) -> web.Response:
        """An answer read whole: passed on decoded, its usage recorded."""
        success = 200 <= status < 300
        try:
            payload = await readable_body(payload, headers, self._limit)
            out_headers = reply_headers(headers)
            reading = await off_loop(_read_metered, payload, payload) if success else None
        except UnreadableBody as exc:  # passed on as sent; recorded, billed nothing
            out_headers = response_headers(headers, keep_length=False)
            reading = Reading(None, None, f"unreadable answer: {exc}") if success else None
        reply = web.Response(body=payload, status=status, headers=out_headers)
        if reading is not None:
            reply.headers.update(await self._settle(exchange, prepared, reading, status))
        return reply

    async def _pass_on(
        self,
        exchange: Exchange,
        prepared: Prepared,
        upstream: aiohttp.ClientResponse,
        payload: bytes,
        encoded: bool,
    ) -> web.StreamResponse:
        """An answer too large to hold: passed on as it arrives, billed from its end (an
        encoded one, whose end cannot be read as it passes, is recorded invalid)."""
        request, status = exchange.request, upstream.status
        if encoded:
            unread = Reading(None, None, too_large(self._limit))
            return await pass_on_unread(
                request,
                upstream,
                payload,
                lambda: self._settle(exchange, prepared, unread, status),
            )

        members = TopLevelMembers()

        async def scan(chunk: bytes) -> None:
            await off_loop(members.feed, chunk, chunk)

        def settle(end: bytes, aborted: bool) -> Awaitable[dict[str, str]]:
            return self._settle(exchange, prepared, _reading_passed_on(members), status, aborted)

        return await pass_on_then_settle(
            request, upstream, payload, settle, self._metrics, scan=scan
        )

    async def _stream(
        self, exchange: Exchange, upstream: Any, prepared: Prepared
    ) -> web.StreamResponse:
        """Relay events as they come. A client that hangs up does not make the engine's
        work free: the upstream is read to its end and the record is marked aborted."""
        request = exchange.request
        reply = web.StreamResponse(
            status=upstream.status,
            reason=upstream.reason,
            headers=response_headers(upstream.headers, keep_length=False),
        )
        await reply.prepare(request)
        scanner = UsageScanner(strip=prepared.strip_usage)
        client_gone = False
        try:
            async for chunk in upstream.content.iter_any():
                out = scanner.feed(chunk)
                if out and not client_gone:
                    client_gone = not await send(reply, out)
        except (aiohttp.ClientError, TimeoutError) as exc:
            abort(request, exc)  # an interrupted upstream stream is not billed
            return reply
        tail = scanner.finish()
        if client_gone:
            client_left(request, self._metrics, billed=scanner.usage is not None)
        reading = _reading_of_stream(scanner)
        if 200 <= upstream.status < 300:
            await self._settle(exchange, prepared, reading, upstream.status, client_gone)
        if client_gone:
            return reply
        if await send(reply, tail + scanner.held):
            await reply.write_eof()
        return reply

    def _refuse(self, exchange: Exchange, message: str, param: str) -> web.Response:
        """A request refused before forwarding (400, vLLM's error shape): counted and
        logged, so that an operator sees what clients were refused and why (no record is
        made: the engine did no work)."""
        self._metrics.refused.labels("400").inc()
        log.warning(
            "request_refused",
            path=exchange.path,
            status=400,
            tenant=exchange.who.tenant,
            param=param,
            reason=message,
        )
        return error_response(400, message, param=param)

    async def _unbillable(
        self, exchange: Exchange, sent: bytes, feature: str
    ) -> web.StreamResponse:
        """A request whose answer carries no usage, relayed unmetered because
        --allow-unmetered names its feature (logged, counted)."""
        self._unmetered.relayed(feature)
        request = exchange.request
        try:
            session, base = request.app[SESSION], self._base
            async with forward(session, base, request, sent, drop=self._drop) as up:
                headers = response_headers(up.headers, keep_length=True)
                return await pass_on(request, up, b"", headers)
        except UpstreamError as exc:
            return upstream_failure(self._metrics, exc)

    async def _tensors(
        self,
        exchange: Exchange,
        upstream: aiohttp.ClientResponse,
        prepared: Prepared,
        metadata: str | None,
    ) -> web.StreamResponse:
        """A ``bytes`` embeddings or pooling answer: raw tensors, the usage in its
        ``metadata`` header. Recorded before the body is passed on (the engine's work is
        done once the answer starts)."""
        headers = response_headers(upstream.headers, keep_length=True)
        if 200 <= upstream.status < 300:
            reading = (
                usage_in_metadata(metadata)
                if metadata is not None
                else Reading(None, None, "raw tensors without a metadata header: no usage")
            )
            headers.update(await self._settle(exchange, prepared, reading, upstream.status))
        return await pass_on(exchange.request, upstream, b"", headers)

    async def settle(
        self,
        exchange: Exchange,
        prepared: Prepared,
        reading: Reading,
        status: int,
        aborted: bool = False,
    ) -> dict[str, str]:
        """Record one metered session that another handler relayed (realtime), once it
        ended: ``aborted`` says whether its client cut it short."""
        return await self._settle(exchange, prepared, reading, status, aborted, ended=True)

    async def _settle(
        self,
        exchange: Exchange,
        prepared: Prepared,
        reading: Reading,
        status: int,
        aborted: bool = False,
        *,
        ended: bool = False,
    ) -> dict[str, str]:
        """Record and journal one metered exchange; the headers its answer carries. Unless
        the exchange has ``ended`` (a session, whose client always closes it), a client
        whose connection is closing left before its answer: aborted."""
        model = self._catalog.model_name(prepared.model)
        path, transport = exchange.path, exchange.request.transport
        if not ended:
            aborted = aborted or transport is None or transport.is_closing()
        if reading.problem:
            self._metrics.invalid_usage.labels(path).inc()
            log.warning("invalid_usage", path=path, problem=reading.problem)
        self._metrics.token_usage(
            prepared.operation, model or "unknown", reading.prompt, reading.completion
        )
        self._metrics.metered(
            path,
            model or "unknown",
            exchange.who.tenant,
            reading.prompt,
            reading.completion,
            cached=reading.cached,
            seconds=reading.seconds,
        )
        record = exchange.record(
            operation=prepared.operation,
            model=model,
            upstream_version=self._catalog.release.version,
            prompt=Billing(reading.prompt, reading.prompt),
            completion=Billing(reading.completion, reading.completion),
            verdict="invalid" if reading.problem else "reported",
            status=status,
            aborted=aborted,
            instance=self._instance,
            n=prepared.copies if prepared.copies > 1 else None,
            units=Units(cached_prompt_tokens=reading.cached, audio_seconds=reading.seconds),
        )
        journaled = await self._recorder.record(record)
        return record_headers(record, journaled)


METERED = web.AppKey("metered_relay", MeteredRelay)


def _read_metered(payload: bytes) -> Reading | None:
    """What a successful metered answer bills: its usage, or an invalid reading when it
    has none (recorded, so the unbilled work shows); None only for an error body."""
    return read_usage(payload, missing=True)


def _reading_of_stream(scanner: UsageScanner) -> Reading:
    """The usage a stream carried; invalid when it could not be known or it carried
    none (recorded, never missing)."""
    if scanner.problem is not None:
        return Reading(None, None, scanner.problem)
    if scanner.usage is None:
        return Reading(None, None, "no usage in the stream: the engine's work is not billed")
    return reading_of(scanner.usage)


def _reading_passed_on(members: TopLevelMembers) -> Reading:
    """The usage of an answer passed on as it came, read as it passed (its top-level
    ``usage``, or Cohere's ``meta``, wherever vLLM wrote it); invalid when it has none."""
    reading = reading_of_members(members.get("usage"), members.get("meta"), missing=True)
    assert reading is not None
    if reading.problem == NO_USAGE:
        problem = "answer passed on as it came (too large to hold, or no room), no usage in it"
        return Reading(None, None, problem)
    return reading
