"""The realtime transcription WebSocket (``GET /v1/realtime``): relayed both ways with
aiohttp's client and server WebSockets, one record per session.

Each direction reads its next message only once the last one was sent on, so a slow
reader slows its sender (back-pressure through both sockets, nothing queued here). The
session bills the sum of the ``transcription.done`` usages vLLM sent
(``proxy.wire.realtime_events``) to the key's tenant, under the served model, recorded
when the session ends.

vLLM sends a generation's ``transcription.done`` only after the client's final commit, and
cancels the generation when its client leaves. So when a client leaves while a generation
may be running, the proxy sends that final commit itself and reads vLLM's messages (sent
nowhere) until the done, vLLM's close or a silence of ``--read-timeout`` (as it waits for
any answer's next chunk), then closes. A session that ends without a done is recorded
invalid with its duration, never silently free.

With limits, the session's opening is admitted on its request limits, and each utterance
again at the commit that starts it, before that commit is forwarded: reserved at what its
generation can cost (``Admission.admit_utterance``), settled at its ``transcription.done``.
One refused ends the session with vLLM's error event, its reason said.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import aiohttp
import structlog
from aiohttp import WSMsgType, web
from yarl import URL

from proxy.accounting.dispatch import Prepared
from proxy.limits.limiter import Ticket
from proxy.metrics import Metrics
from proxy.serving.admission import Admission
from proxy.serving.exchange import Exchange
from proxy.serving.tracing import send_trace
from proxy.serving.upstream import (
    FORWARDED,
    SESSION,
    TARGET,
    UpstreamError,
    error_response,
    request_headers,
    translated,
    upstream_failure,
)
from proxy.settings import Settings
from proxy.wire.realtime_events import (
    FINAL_COMMIT,
    MOST_SCREENED,
    Event,
    SessionUsage,
    client_event,
)
from proxy.wire.usage import Reading

log = structlog.get_logger("proxy.serving.realtime")

# Largest message relayed either way (vLLM's server takes uvicorn's 16 MiB default).
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
# The WebSocket handshake's own headers: each side's socket sets its own.
HANDSHAKE = frozenset({"sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions"})
# The error event's code when an utterance is refused by the tenant's limits.
REFUSED_CODE = "rate_limit_exceeded"
Settle = Callable[[Exchange, Prepared, Reading, int, bool], Awaitable[dict[str, str]]]


class Refused(Exception):
    """The upstream answered the upgrade with another status (its own refusal)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class RealtimeRelay:
    """The handler of ``/v1/realtime`` sessions."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        settle: Settle,
        serves: Callable[[str], bool],
        admission: Admission | None = None,
    ) -> None:
        self._base = settings.upstream_base
        self._wait = settings.read_timeout
        self._metrics = metrics
        self._settle = settle
        self._serves = serves
        self._admission = admission

    async def __call__(self, exchange: Exchange) -> web.StreamResponse:
        request = exchange.request
        down = web.WebSocketResponse(max_msg_size=MAX_MESSAGE_BYTES, autoping=True)
        if not down.can_prepare(request).ok:  # Starlette routes a plain GET nowhere
            return error_response(404, "Not Found")
        if self._admission is not None:  # its request limits; each utterance at its commit
            refusal = await self._admission.admit_session(exchange)
            if refusal is not None:
                return refusal
        try:
            up = await self._connect(request)
        except Refused as exc:
            return error_response(exc.status, f"the upstream refused the session: {exc}")
        except UpstreamError as exc:
            return upstream_failure(self._metrics, exc)
        usage = SessionUsage(serves=self._serves)
        meter = Utterances(self._admission, exchange, usage)
        async with up:
            await down.prepare(request)
            try:
                client_left = await _relay(down, up, usage, meter, self._wait)
            finally:
                await meter.end()
        if not down.closed:
            await down.close(code=up.close_code or aiohttp.WSCloseCode.OK)
        problem = usage.why_unbilled
        reading = (
            Reading(None, None, problem) if problem else Reading(usage.prompt, usage.completion)
        )
        # a served name the client chose, else the served default (as admitted)
        prepared = Prepared(b"", exchange.route.operation, usage.model)
        # a client ends every session: aborted is one it cut short of its usage
        await self._settle(exchange, prepared, reading, 101, client_left and bool(problem))
        return down

    async def _connect(self, request: web.Request) -> aiohttp.ClientWebSocketResponse:
        headers = request_headers(request.headers)
        for name in HANDSHAKE:
            headers.popall(name, None)
        send_trace(request, headers)
        url = URL(self._base + request[TARGET].sent, encoded=True)
        request[FORWARDED] = True
        with translated(request[TARGET].path):
            try:
                return await request.app[SESSION].ws_connect(
                    url, headers=headers, max_msg_size=MAX_MESSAGE_BYTES, autoping=True
                )
            except aiohttp.WSServerHandshakeError as exc:  # vLLM's answer, not a failure
                raise Refused(exc.status, exc.message) from exc


class Utterances:
    """A session's utterances against its tenant's limits: each reserved at the commit
    that starts it, before that commit is forwarded, and settled at its
    ``transcription.done``; one still open when the session ends (its done never came) is
    charged nothing, as the session's record bills nothing for it."""

    def __init__(
        self, admission: Admission | None, exchange: Exchange, usage: SessionUsage
    ) -> None:
        self._admission, self._exchange, self._usage = admission, exchange, usage
        self._open: Ticket | None = None
        self.refusal: str | None = None

    async def admit(self, event: Event | None) -> bool:
        """Whether a client message (``client_event``) may be forwarded: a commit that
        starts a generation must be admitted first (its refusal is kept, to be said)."""
        if self._admission is None or not self._usage.starts(event):
            return True
        model = self._usage.model
        admitted = await self._admission.admit_utterance(self._exchange, model)
        if isinstance(admitted, str):
            self.refusal = admitted
            return False
        await self._close(None)  # a commit vLLM ignored left nothing open; kept safe
        self._open = admitted
        return True

    async def heard(self, ended_before: int) -> None:
        """After a server message: a done settles the open utterance at its usage (at
        nothing when that cannot be read); a generation that ended without one (vLLM
        refused the commit) gives it back."""
        if self._open is None or self._admission is None:
            return
        if self._usage.ended > ended_before:
            ticket, self._open = self._open, None
            await self._admission.settle_utterance(ticket, self._usage.last, self._exchange.hold)
        elif not self._usage.running:
            ticket, self._open = self._open, None
            await self._admission.release_utterance(ticket)

    async def end(self) -> None:
        await self._close(None)

    async def _close(self, usage: tuple[int, int] | None) -> None:
        if self._open is not None and self._admission is not None:
            ticket, self._open = self._open, None
            await self._admission.settle_utterance(ticket, usage, self._exchange.hold)


async def _relay(
    down: web.WebSocketResponse,
    up: aiohttp.ClientWebSocketResponse,
    usage: SessionUsage,
    meter: Utterances,
    wait: float,
) -> bool:
    """Both directions until either side closes; whether the client closed first (or
    its session was ended by its limits)."""
    idle = asyncio.Event()  # set when a message from vLLM leaves no generation running
    heard = asyncio.Event()  # set at each message from vLLM

    async def from_server(text: str) -> bool:
        before = usage.ended
        usage.from_server(text)
        heard.set()
        await meter.heard(before)
        if not usage.running:
            idle.set()
        return True

    async def from_client(text: str) -> bool:
        # read as vLLM reads it; a large message (audio, or padding) off the loop
        big = len(text) > MOST_SCREENED
        event = await asyncio.to_thread(client_event, text) if big else client_event(text)
        if not await meter.admit(event):
            await _refuse(down, meter.refusal or "")
            return False
        usage.from_client(event)
        return True

    to_upstream = asyncio.create_task(pump(down, up, from_client))
    to_client = asyncio.create_task(pump(up, down, from_server))
    done, _ = await asyncio.wait({to_upstream, to_client}, return_when=asyncio.FIRST_COMPLETED)
    client_first = to_upstream in done
    if client_first:
        await _finish(up, usage, to_client, (idle, heard), wait)
        await up.close()  # vLLM aborts what still runs, as when its client leaves
    else:
        await down.close(code=up.close_code or aiohttp.WSCloseCode.OK)
    await asyncio.gather(to_upstream, to_client)
    return client_first


async def _refuse(down: web.WebSocketResponse, message: str) -> None:
    """vLLM's realtime error event (``ErrorEvent``: type, error, code), then the close."""
    event = {"type": "error", "error": message, "code": REFUSED_CODE}
    try:
        await down.send_str(json.dumps(event))
        await down.close(code=aiohttp.WSCloseCode.POLICY_VIOLATION)
    except (ConnectionError, aiohttp.ClientError):
        return


async def _finish(
    up: aiohttp.ClientWebSocketResponse,
    usage: SessionUsage,
    reading: asyncio.Task[None],
    events: tuple[asyncio.Event, asyncio.Event],
    wait: float,
) -> None:
    """The client left: a generation that may be running gets its final commit (unless the
    client sent it), and ``reading`` (vLLM's messages, noted, sent nowhere) goes on until
    the generation's transcription.done, vLLM's close or ``wait`` seconds without a
    message from vLLM (the engine still finishing sends its deltas)."""
    if not usage.running:
        return
    idle, heard = events
    idle.clear()
    if not usage.final_sent:
        usage.from_client(client_event(FINAL_COMMIT))
        try:
            await up.send_str(FINAL_COMMIT)
        except (ConnectionError, aiohttp.ClientError):
            return
    while usage.running and not reading.done():
        heard.clear()
        waiting = [asyncio.create_task(e.wait()) for e in (idle, heard)]
        try:
            done, _ = await asyncio.wait(
                {reading, *waiting}, timeout=wait, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for task in waiting:
                task.cancel()
        if not done:
            break
    if usage.running:
        log.warning("realtime_done_not_received", silent_s=wait)


async def pump(
    source: web.WebSocketResponse | aiohttp.ClientWebSocketResponse,
    sink: web.WebSocketResponse | aiohttp.ClientWebSocketResponse,
    note: Callable[[str], Awaitable[bool]],
) -> None:
    """Messages from ``source`` to ``sink``, one at a time, until ``source`` closes; each
    text message is read by ``note`` first, and one it answers False to is not sent and
    ends the pumping. Once ``sink`` is closed they are still read and noted (a usage in
    flight), sent nowhere."""
    sending = True
    try:
        async for message in source:
            if message.type is WSMsgType.TEXT and not await note(message.data):
                return
            if not sending or sink.closed:
                continue
            try:
                if message.type is WSMsgType.TEXT:
                    await sink.send_str(message.data)
                elif message.type is WSMsgType.BINARY:
                    await sink.send_bytes(message.data)
            except (ConnectionError, aiohttp.ClientError) as exc:
                log.info("realtime_side_closed", error=type(exc).__name__)
                sending = False
    except (ConnectionError, aiohttp.ClientError) as exc:
        log.info("realtime_side_closed", error=type(exc).__name__)
