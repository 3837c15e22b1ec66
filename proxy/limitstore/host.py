"""The pod's limiter without a store: the supervisor of ``serve --workers N`` hosts one
``InProcessLimiter`` on a Unix socket, and every worker admits through it
(``limitstore.hosted``), so the workers share each budget, rate and concurrency limit
exactly (docs/workers.md, "Limits").

Exact because every reservation runs to completion on the host's one event loop, as in
one process. Each connection owns the tickets it reserved; when it closes without settling
them (its worker died), its concurrency gates are released at once, its rates stay taken
(the requests may have reached the engine), and its budget units stay held until the
worker's journal shard has been read again (``reread``), which then counts what it billed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from dataclasses import dataclass, field
from pathlib import Path

import structlog
from pydantic import ValidationError

from proxy.limits.history import History
from proxy.limits.limiter import Ticket
from proxy.limits.meters import BudgetMeter, Gate
from proxy.limits.policy import Policies
from proxy.limitstore.hostwire import (
    LINE_LIMIT,
    TO_HOST,
    VERSION,
    Answer,
    Ask,
    Bye,
    Failure,
    Hello,
    Loaded,
    Message,
    Release,
    Replace,
    Reserve,
    Settle,
    Standings,
    Welcome,
    digest,
)
from proxy.limitstore.memory import InProcessLimiter

log = structlog.get_logger("proxy.limitstore.host")


class ProtocolError(Exception):
    """A line the host cannot take: the connection is closed."""


@dataclass(slots=True, eq=False)
class _Connection:
    part: int
    tickets: dict[int, Ticket] = field(default_factory=dict)
    closed: asyncio.Event = field(default_factory=asyncio.Event)  # set once ``_lost`` ran


class LimiterHost:
    """``limiter`` served on the Unix socket at ``path``."""

    def __init__(self, limiter: InProcessLimiter, path: Path) -> None:
        self.limiter = limiter
        self.path = path
        self._server: asyncio.Server | None = None
        self._numbers = itertools.count(1)
        self._digest = digest(limiter.policies)
        self._applied = {self._digest}  # every file ever applied: older ones, by digest
        self._connections: set[_Connection] = set()
        # Dead workers' budget tickets, by part, until their shard is read again.
        self.held: dict[int, list[Ticket]] = {}
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(
            self._serve, path=str(self.path), limit=LINE_LIMIT
        )

    async def close(self) -> None:
        """Stop listening and close every worker's connection."""
        if self._server is not None:
            self._server.close()
            for writer in list(self._writers):
                writer.close()
            await self._server.wait_closed()
            self._server = None

    async def hung_up(self, part: int) -> None:
        """Once every connection of ``part`` has closed and its tickets were taken into
        ``held`` (``_lost`` ran): a dead worker's socket closes with its process, and the
        host reads the end of it on its loop, perhaps after the supervisor saw the exit."""
        for connection in [c for c in self._connections if c.part == part]:
            await connection.closed.wait()

    def reread(self, part: int, history: History) -> None:
        """Replace ``part``'s usage by its journal shard's (``history``, built off the
        loop), then drop the budget units a dead worker of that part still held: the
        shard now counts every record it committed, settled or not. Call it after
        ``hung_up(part)``: the held units are then all in ``held``."""
        self.limiter.adopt(part, history)
        for ticket in self.held.pop(part, []):
            self._give(ticket, BudgetMeter)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        connection: _Connection | None = None
        try:
            connection = _Connection(self._greet(await _line(reader)).part)
            self._connections.add(connection)
            writer.write(Welcome(version=VERSION).line())
            while line := await _line(reader):
                message = _parsed(line)
                if isinstance(message, Bye):
                    break
                answer = await self._handle(message, connection)
                if answer is not None:
                    writer.write(answer.line())
        except ProtocolError as exc:
            log.error("limiter_host_protocol_error", error=str(exc))
            writer.write(Failure(why=str(exc)).line())
        except ConnectionError:
            pass
        finally:
            self._writers.discard(writer)
            if connection is not None:
                self._lost(connection)
                self._connections.discard(connection)
                connection.closed.set()
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    def _greet(self, line: bytes) -> Hello:
        hello = _parsed(line)
        if not isinstance(hello, Hello):
            raise ProtocolError(f"the first line must be a hello, not {line[:80]!r}")
        if hello.version != VERSION:
            raise ProtocolError(f"protocol version {hello.version}: this host speaks {VERSION}")
        return hello

    async def _handle(self, message: Message, connection: _Connection) -> Answer | Standings | None:
        if isinstance(message, Reserve):
            decision = await self.limiter.reserve(message.who, message.cost, message.now)
            number = None
            if decision.ticket is not None:
                number = next(self._numbers)
                connection.tickets[number] = decision.ticket
            return Answer(
                n=message.n,
                ticket=number,
                refusal=decision.refusal,
                requests=decision.requests,
                tokens=decision.tokens,
                budgets=decision.budgets,
                cost=decision.cost,
            )
        if isinstance(message, Settle):
            if (ticket := connection.tickets.pop(message.ticket, None)) is not None:
                await self.limiter.settle(ticket, message.billed, message.now, part=connection.part)
        elif isinstance(message, Release):
            if (ticket := connection.tickets.pop(message.ticket, None)) is not None:
                await self.limiter.release(ticket, message.now)
        elif isinstance(message, Replace):
            self._replace(message)
        elif isinstance(message, Loaded):
            self._loaded(message, connection)
        elif isinstance(message, Ask):
            limits = await self.limiter.standing(message.tenant, message.now)
            return Standings(n=message.n, limits=tuple(limits))
        else:
            raise ProtocolError(f"unexpected {message.model_dump_json()[:80]}")
        return None

    def _replace(self, message: Replace) -> None:
        """New policies, once: every worker that reloaded the file sends them."""
        changed = digest(message.policies)
        if changed != self._digest:
            self.limiter.replace(message.policies)
            self._digest = changed
            self._applied.add(changed)

    def _loaded(self, message: Loaded, connection: _Connection) -> None:
        """A worker's policies at its start: a file the host never applied is newer (it
        changed before any reload said so) and applied; one it applied before is older
        (the worker read it before the change): kept out, logged, until its reload."""
        loaded = digest(message.policies)
        if loaded not in self._applied:
            self._replace(Replace(policies=message.policies))
        elif loaded != self._digest:
            log.warning("limits_older_in_worker", part=connection.part, digest=loaded[:12])

    def _lost(self, connection: _Connection) -> None:
        """A connection closed with tickets open: its worker died or hung up mid-request."""
        if not connection.tickets:
            return
        tickets = list(connection.tickets.values())
        connection.tickets.clear()
        for ticket in tickets:
            self._give(ticket, Gate)
            ticket.end()
        self.held.setdefault(connection.part, []).extend(tickets)
        log.warning("limiter_host_tickets_orphaned", part=connection.part, tickets=len(tickets))

    def _give(self, ticket: Ticket, kind: type[Gate] | type[BudgetMeter]) -> None:
        """Give back what ``ticket`` holds on the meters of ``kind``."""
        for scope, name, unit in ticket.taken:
            meter = self.limiter.meters.get((scope, name))
            if isinstance(meter, kind):
                meter.give(ticket.cost.of(unit), time.time())


async def _line(reader: asyncio.StreamReader) -> bytes:
    """The next line (b"" at the end), one longer than ``LINE_LIMIT`` a ``ProtocolError``."""
    try:
        return await reader.readline()
    except ValueError as exc:  # the limit overrun; the stream cannot go on
        raise ProtocolError(f"a line over {LINE_LIMIT} bytes: {exc}") from None


def _parsed(line: bytes) -> Message:
    try:
        message: Message = TO_HOST.validate_json(line)
    except ValidationError as exc:
        raise ProtocolError(f"not a message: {exc.errors()[0]['msg']}: {line[:80]!r}") from None
    return message


def build_host(policies: Policies, path: Path) -> LimiterHost:
    """The pod's limiter host on the Unix socket ``path``: one in-process limiter of
    ``policies`` every worker admits through (started by the caller)."""
    return LimiterHost(InProcessLimiter(policies), path)
