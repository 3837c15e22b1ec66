"""The settlements and releases the store missed (breaker open, or the call failed), kept
by ticket id (at most ``MISSED_HELD``) and sent again once it answers: a tenant's own
before its next admission, the rest in the background. Each end is idempotent by id."""

from __future__ import annotations

import asyncio
import contextlib

from proxy.limits.limiter import Cost, Ticket
from proxy.limitstore.calls import StoreCalls
from proxy.limitstore.client import STORE_ERRORS
from proxy.limitstore.redislimiter import RedisLimiter

MISSED_HELD = 10_000  # missed settlements and releases kept to send again


class Replay:
    """The ends the store missed, and their second sending."""

    def __init__(self, shared: RedisLimiter, calls: StoreCalls) -> None:
        self._shared = shared
        self._calls = calls
        self.missed: dict[str, tuple[Ticket, Cost, str]] = {}
        self._replaying: asyncio.Task[None] | None = None

    def miss(self, ticket: Ticket, billed: Cost, mode: str) -> None:
        """An end the store did not get: kept to send again (the oldest dropped beyond
        MISSED_HELD; its reservation then expires by its TTL)."""
        if not ticket.id:
            return
        if len(self.missed) >= MISSED_HELD:
            del self.missed[next(iter(self.missed))]
        self.missed[ticket.id] = (ticket, billed, mode)

    def resume(self) -> None:
        """The store answers again: every missed end sent in the background."""
        if self.missed and (self._replaying is None or self._replaying.done()):
            self._replaying = asyncio.get_running_loop().create_task(self.replay(None))

    async def replay(
        self, tenant: str | None, most: int | None = None, deadline: float | None = None
    ) -> None:
        """Send the missed ends again (a tenant's only, at ``most`` and before
        ``deadline``, inline in its admission; or all, each in a slot); one that fails is
        kept for the next time."""
        keys = [k for k, (t, _, _) in self.missed.items() if tenant in (None, t.who.tenant)]
        loop = asyncio.get_running_loop()
        for key in keys[:most]:
            if deadline is not None and loop.time() >= deadline:
                return
            end = self.missed.get(key)
            if end is None:
                continue
            ticket, billed, mode = end
            op = operation(mode)
            try:
                if tenant is None:
                    async with self._calls.slots:
                        await self._calls.call(op, self._shared.finish(ticket, billed, mode))
                else:
                    await self._calls.call(op, self._shared.finish(ticket, billed, mode))
            except STORE_ERRORS as exc:
                self._calls.failed(op, exc)
                return
            # kept until sent: an admission's timeout (a cancellation) leaves it here
            self.missed.pop(key, None)

    async def close(self) -> None:
        if self._replaying is not None:
            self._replaying.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._replaying


def operation(mode: str) -> str:
    """The store operation an end is counted as (metrics, logs): a ``late`` settlement is
    a settlement."""
    return "release" if mode == "release" else "settle"
