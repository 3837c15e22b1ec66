"""A pod worker's limiter: the ``Limiter`` protocol over one connection to the pod's
limiter host (``limitstore.host``), so that a tenant's whole remainder is usable through
any worker and a burst spread over every worker is admitted exactly as one process admits
it.

``reserve`` and ``standing`` are one round trip each; ``settle`` and ``release`` are
written without waiting (the host takes one connection's lines in order). ``restore`` does
nothing here: the host reads every shard. The limiter is built before it connects
(``open``, in the worker's start-up: the application's limits file holds it). Once the
host is gone (its connection closed), limited requests are refused as a store outage
refuses them in closed mode (503), never admitted unmetered.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from pydantic import ValidationError

from proxy.limits.limiter import (
    Cost,
    Decision,
    Lifetime,
    LimitStanding,
    Refusal,
    StandingUnknown,
    Ticket,
    Usage,
    Who,
)
from proxy.limits.policy import Policies
from proxy.limitstore.hostwire import (
    FROM_HOST,
    LINE_LIMIT,
    VERSION,
    Answer,
    Ask,
    Bye,
    Failure,
    Hello,
    Loaded,
    Release,
    Replace,
    Reserve,
    Settle,
    Standings,
    Welcome,
)

log = structlog.get_logger("proxy.limitstore.hosted")
WELCOME_SECONDS = 10.0
GONE = "the pod's limiter host is gone: limited requests are refused until this worker restarts"


class HostError(Exception):
    """The limiter host refused this worker, or could not be reached."""


@dataclass(slots=True)
class HostedTicket(Ticket):
    """A reservation the host holds, by its number there."""

    number: int = 0


class HostedLimiter:
    """``proxy.limits.limiter.Limiter`` on the pod's limiter host."""

    shared_store = False  # the pod's host, not a store every replica reads

    def __init__(self, policies: Policies, path: Path, part: int) -> None:
        self.policies = policies
        self.path, self.part = path, part
        self._writer: asyncio.StreamWriter | None = None
        self._numbers = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Answer | Standings | None]] = {}
        self._gone: str | None = "not connected to the pod's limiter host yet"
        self._listening: asyncio.Task[None] | None = None

    @classmethod
    async def connect(cls, path: Path, policies: Policies, part: int) -> HostedLimiter:
        """A limiter connected to the host at ``path`` as worker ``part``."""
        limiter = cls(policies, path, part)
        await limiter.open()
        return limiter

    async def open(self) -> None:
        """Connect as worker ``part`` (its journal shard), before the worker serves; the
        policies it loaded follow the hello (``Loaded``: applied only if the host never
        applied them, so a worker that read the file before it changed rolls nothing
        back). ``HostError``: no host."""
        path = self.path
        try:
            reader, writer = await asyncio.open_unix_connection(str(path), limit=LINE_LIMIT)
        except OSError as exc:
            raise HostError(f"cannot reach the limiter host at {path}: {exc}") from None
        writer.write(Hello(version=VERSION, part=self.part).line())
        try:
            async with asyncio.timeout(WELCOME_SECONDS):
                answer = _parsed(await reader.readline())
        except (TimeoutError, ConnectionError, HostError, ValueError) as exc:
            writer.close()
            raise HostError(f"no welcome from the limiter host at {path}: {exc!r}") from None
        if not isinstance(answer, Welcome):
            writer.close()
            why = answer.why if isinstance(answer, Failure) else "no welcome"
            raise HostError(f"the limiter host at {path} refused this worker: {why}")
        self._writer, self._gone = writer, None
        self._send(Loaded(policies=self.policies).line())
        self._listening = asyncio.create_task(self._listen(reader), name="limiter-host")

    def wants_tokens(self, tenant: str) -> bool:
        return self.policies.wants_tokens(tenant)

    def replace(self, policies: Policies) -> None:
        """Use ``policies`` here (what needs a cost) and send them to the host, which
        applies them once for the pod."""
        self.policies = policies
        self._send(Replace(policies=policies).line())

    async def reserve(self, who: Who, cost: Cost, now: float) -> Decision:
        if self._gone is not None:
            return _unavailable(who, self._gone)
        n = next(self._numbers)
        answer = await self._ask(n, Reserve(n=n, who=who, cost=cost, now=now).line())
        if not isinstance(answer, Answer):
            return _unavailable(who, self._gone or GONE)
        ticket = None
        if answer.ticket is not None:
            ticket = HostedTicket(who, cost, number=answer.ticket)
        return Decision(
            ticket, answer.refusal, answer.requests, answer.tokens, answer.budgets, answer.cost
        )

    async def settle(self, ticket: Ticket, billed: Cost, now: float) -> None:
        if isinstance(ticket, HostedTicket) and ticket.end():
            self._send(Settle(ticket=ticket.number, billed=billed, now=now).line())

    async def release(self, ticket: Ticket, now: float) -> None:
        if isinstance(ticket, HostedTicket) and ticket.end():
            self._send(Release(ticket=ticket.number, now=now).line())

    def problem(self) -> tuple[str, bool] | None:
        """A worker whose host is gone fails readiness (its limited requests are refused)."""
        return (self._gone, True) if self._gone is not None else None

    def lifetime(self, *, journaled: bool) -> Lifetime:
        """Connected while the worker serves: before it accepts (``HostError``: no host),
        goodbye after its exchanges have settled."""

        async def connected(app: Any) -> AsyncIterator[None]:
            await self.open()
            yield
            await self.close()

        return connected

    async def standing(self, tenant: str, now: float) -> list[LimitStanding]:
        """``tenant``'s standing as the host's limiter has it: the pod's, through any
        worker (``StandingUnknown`` once the host is gone)."""
        if self._gone is not None:
            raise StandingUnknown(self._gone)
        n = next(self._numbers)
        answer = await self._ask(n, Ask(n=n, tenant=tenant, now=now).line())
        if not isinstance(answer, Standings):
            raise StandingUnknown(self._gone or GONE)
        return list(answer.limits)

    async def restore(self, history: Iterable[Usage], now: float) -> int:
        """Nothing: the host reads every worker's shard before any worker starts."""
        return 0

    async def close(self) -> None:
        """Say goodbye (every ticket is settled or released by now) and hang up."""
        self._send(Bye().line())
        self._gone = "this worker's limiter is closed"
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(ConnectionError):
                await self._writer.wait_closed()
        if self._listening is not None:
            self._listening.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listening

    async def _ask(self, n: int, line: bytes) -> Answer | Standings | None:
        """Send ``line`` and wait for the answer numbered ``n`` (None: the host is gone)."""
        future: asyncio.Future[Answer | Standings | None]
        future = asyncio.get_running_loop().create_future()
        self._waiting[n] = future
        self._send(line)
        try:
            return await future
        finally:
            self._waiting.pop(n, None)

    def _send(self, line: bytes) -> None:
        writer = self._writer
        if self._gone is None and writer is not None and not writer.is_closing():
            writer.write(line)

    async def _listen(self, reader: asyncio.StreamReader) -> None:
        """Hand each answer to the call waiting for it, until the host hangs up."""
        why = GONE
        try:
            while line := await reader.readline():
                answer = _parsed(line)
                if isinstance(answer, Answer | Standings):
                    future = self._waiting.get(answer.n)
                    if future is not None and not future.done():
                        future.set_result(answer)
                elif isinstance(answer, Failure):
                    why = f"the pod's limiter host refused this worker: {answer.why}"
        except (ConnectionError, HostError, ValueError) as exc:  # ValueError: over LINE_LIMIT
            why = f"{GONE} ({exc})"
        finally:
            self._lost(why)

    def _lost(self, why: str) -> None:
        if self._gone is None:  # not closed by this worker
            self._gone = why
            log.error("limiter_host_lost", why=why)
        for future in self._waiting.values():
            if not future.done():
                future.set_result(None)


def _unavailable(who: Who, why: str) -> Decision:
    refusal = Refusal("limiter_host", ("tenant", who.tenant), 1.0, 0, 0, unavailable=True, why=why)
    return Decision(None, refusal, None, None)


def _parsed(line: bytes) -> Welcome | Answer | Standings | Failure:
    if not line:
        raise HostError("the limiter host closed the connection")
    try:
        return FROM_HOST.validate_json(line)
    except ValidationError as exc:
        raise HostError(f"not a message from the host: {line[:80]!r}") from exc
