"""The settlements and releases the store missed (breaker open, or the call failed), kept
by ticket id (at most ``MISSED_HELD``) and sent again once it answers: a tenant's own
before its next admission, the rest in the background. Each end is idempotent by id."""

from __future__ import annotations

import asyncio

from proxy.limits.limiter import Cost, Ticket
from proxy.limitstore.breaker import STORE_ERRORS
from proxy.limitstore.calls import StoreCalls

MISSED_HELD = 10_000  # missed settlements and releases kept to send again


class Replay(StoreCalls):
    """The ends the store missed, and their second sending."""

    def _miss(self, ticket: Ticket, billed: Cost, mode: str) -> None:
        """An end the store did not get: kept to send again (the oldest dropped beyond
        MISSED_HELD; its reservation then expires by its TTL)."""
        key = getattr(ticket, "id", "")
        if not key:
            return
        if len(self.missed) >= MISSED_HELD:
            del self.missed[next(iter(self.missed))]
        self.missed[key] = (ticket, billed, mode)

    async def _replay(
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
            op = _op(mode)
            try:
                if tenant is None:
                    async with self.slots:
                        await self._call(op, self.shared.finish(ticket, billed, mode))
                else:
                    await self._call(op, self.shared.finish(ticket, billed, mode))
            except STORE_ERRORS as exc:
                self._failed(op, exc)
                return
            # kept until sent: an admission's timeout (a cancellation) leaves it here
            self.missed.pop(key, None)


def _op(mode: str) -> str:
    """The store operation an end is counted as (metrics, logs): a ``late`` settlement is
    a settlement."""
    return "release" if mode == "release" else "settle"
