"""The shared limiter as admission uses it: behind a short timeout and a circuit breaker,
with each tenant's fail mode while the store cannot answer for the budgets (unreachable,
or rebuilding after it was found empty), this replica's heartbeat in the store, and its
contribution of its journal to the store's budgets. ``wiring`` builds it.

Local fail mode divides; it never multiplies. A replica admits by its share only when it
knows both what to divide and by how many: the replica count (``--limits-replicas``, else
the live count of the last heartbeat the store answered once this replica had stayed a
whole registry TTL in it, so that every replica that stayed as long is in the count) and,
for a budget, what the store last told it was left of it (or the whole amount for a
period that began after the store last answered it). A limit it cannot divide refuses
(503), logged and counted.

The class is built in layers, one concern a module, each on the one before: its state and
the remainders (``remainders``), the store calls (``calls``), the missed ends sent again
(``replay``), the contribution (``contribution``), the heartbeat (``heartbeat``) and the
fail modes (``failmodes``); here, admission and the ends of reservations."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from proxy.limits.limiter import Cost, Decision, LimitStanding, StandingUnknown, Ticket, Who
from proxy.limits.policy import FailMode
from proxy.limitstore.breaker import STORE_ERRORS
from proxy.limitstore.failmodes import FailModes
from proxy.limitstore.replay import _op
from proxy.limitstore.tickets import LocalTicket, Rebuilding, StoreTicket, Taken

NOTHING = Cost(0, 0, 0)
INLINE_ENDS = 8  # a tenant's missed ends sent before its admission; the rest in the background


def _before(deadline: float) -> None:
    """A round trip is only begun before the admission's deadline."""
    if asyncio.get_running_loop().time() >= deadline:
        raise TimeoutError


class GuardedLimiter(FailModes):
    """The shared limiter behind a short timeout and a circuit breaker, with the fail
    mode of each tenant while the store cannot answer: ``closed`` refuses (503),
    ``open`` admits, ``local`` enforces this replica's share in process (of what the
    store last said was left of each budget, else of the limit: ``proxy.limitstore.divided``).
    What is billed meanwhile is contributed to the store when it answers again (as this
    replica's total: a retry counts nothing twice)."""

    async def reserve(self, who: Who, cost: Cost, now: float) -> Decision:
        """The store's decision within one ``timeout`` in all (a reservation, and on a
        store found empty this replica's contribution and a second try), else the fail
        mode's."""
        reason = "unreachable"
        try:
            async with self.slots:
                await asyncio.sleep(0)  # the tasks queued before this one run first
                deadline = asyncio.get_running_loop().time() + self.timeout
                async with asyncio.timeout_at(deadline):  # from here: a slot held
                    decision, reason = await self._reserve_in_store(who, cost, now, deadline)
        except TimeoutError as exc:  # the round trips together outlasted the timeout
            self._failed("reserve", exc)
            decision = None
        if decision is not None:
            return decision
        return await self._fail(who, cost, now, reason)

    async def _reserve_in_store(
        self, who: Who, cost: Cost, now: float, deadline: float
    ) -> tuple[Decision | None, str]:
        """The store's decision, or None and why the store did not decide (unreachable,
        or its budgets' generation incomplete: every tenant then has its fail mode). A
        reservation whose answer is lost is cancelled once the store answers again. The
        deadline is checked between round trips too (on Python 3.11 a timeout's cancel
        can be lost inside the client's own wait)."""
        for attempt in (0, 1):
            if not self.breaker.allows(self._clock()):
                return None, "unreachable"
            if self.missed:  # the tenant's ends the store missed free their holds first
                await self._replay(who.tenant, INLINE_ENDS, deadline)
            _before(deadline)
            seq, left = self.seq, dict[str, tuple[int, float, Taken]]()
            ticket = self.shared.ticket(who, cost, now)
            try:
                decision = await self._call("reserve", self.shared.reserve_ticket(ticket, left))
            except Rebuilding as exc:
                self._back()
                self.complete = False
                if attempt or exc.contributed:
                    return None, "rebuilding"
                _before(deadline)
                await self.contribute()
            except STORE_ERRORS as exc:
                self._miss(ticket, NOTHING, "cancel")
                self._failed("reserve", exc)
                return None, "unreachable"
            except BaseException:  # cancelled (the admission's timeout, or shutdown)
                self._miss(ticket, NOTHING, "cancel")
                raise
            else:
                self._back()
                self.complete = True
                self._remember(left, seq)
                if decision.ticket is not None and self._local_mode(who):
                    self.local.count_rates(who, cost, now)
                return decision, ""
        return None, "rebuilding"

    async def standing(self, tenant: str, now: float) -> list[LimitStanding]:
        """The store's reading (the same on every replica), within the timeout; nothing
        this replica holds alone stands in for it (``StandingUnknown``)."""
        if self.breaker.open:  # a read never takes the half-open try admission waits for
            raise StandingUnknown("the limits store is unreachable")
        try:
            async with self.slots:  # the store's connections are admission's first
                return await self._call("standing", self.shared.standing(tenant, now))
        except STORE_ERRORS as exc:
            raise StandingUnknown("the limits store did not answer") from exc

    def _local_mode(self, who: Who) -> bool:
        return self.shared.policies.fail_mode(who.tenant, self.fail_mode) is FailMode.LOCAL

    async def settle(self, ticket: Ticket, billed: Cost, now: float) -> None:
        await self._end(ticket, billed, now, settle=True)

    async def release(self, ticket: Ticket, now: float) -> None:
        await self._end(ticket, Cost(0, 0, 0), now, settle=False)

    async def _end(self, ticket: Ticket, billed: Cost, now: float, *, settle: bool) -> None:
        if not ticket.open:
            return
        if isinstance(ticket, LocalTicket):
            await self._end_local(ticket, billed, now, settle=settle)
            return
        if settle:
            self.shared.note(ticket, billed, now)
            self.local.history.note(ticket.who, billed, now)
            self._stale = True  # a settlement after an outage began counts in its share
            self._beyond_reserved(ticket, billed)
        mode = "settle" if settle else "release"
        orphan = isinstance(ticket, StoreTicket) and ticket.generation != self.shared.generation
        self.shared.ended(ticket)  # else the store's reservation expires by its TTL
        if orphan:  # reserved in a store state that is gone: it was in this replica's part
            self.shared.sending.pop(getattr(ticket, "id", ""), None)  # its bill is, now
            mode = "late" if settle else mode
            self.dirty = True
        if await self._send(
            ticket, billed, mode, lambda: self._unconfirmed(ticket, billed, mode, settle)
        ):
            self._back()
            if orphan:
                self._contribute_soon()
            if settle and _crossed(ticket, now):
                # the store added it to the period it was reserved in; the journal bills
                # it in this one: this replica's part of it, at once
                self.dirty = True
                await self.contribute(now)

    def _unconfirmed(self, ticket: Ticket, billed: Cost, mode: str, settle: bool) -> None:
        """An end the store did not confirm: a settlement is in this replica's part from
        now on (contributed as its total) and sent again ``late``, a release again as it
        is (see RedisLimiter.finish)."""
        self.shared.sending.pop(getattr(ticket, "id", ""), None)
        self._miss(ticket, billed, "late" if settle else mode)
        if settle and isinstance(ticket, StoreTicket):  # its first sending may still land
            self.shared.unclaimed[ticket.id] = ticket
        self.dirty = self.dirty or settle

    async def _end_local(
        self, ticket: LocalTicket, billed: Cost, now: float, *, settle: bool
    ) -> None:
        ticket.open = False
        for key, left, unit, units in ticket.charged:  # held until now; billed from now on
            spent = (billed.of(unit) if settle else 0) - units
            current = self.left.get(key)
            if current is left:
                left.spent += spent
            elif current is not None:  # read since, its hold in it: only a bill beyond it
                current.spent += max(spent, 0)
        if ticket.inner is not None:
            if settle:
                await self.local.settle(ticket.inner, billed, now)
            else:
                await self.local.release(ticket.inner, now)
        elif settle:
            self.local.history.note(ticket.who, billed, now)
        if settle:
            self.shared.history.note(ticket.who, billed, now)
        del self.shared.holds[ticket.id]  # billed now, or given back
        self.dirty = True
        if ticket.adopting:  # its holds in the store given back; its bill in the part
            mode = "late" if settle else "release"
            await self._send(ticket, NOTHING, mode, lambda: self._miss(ticket, NOTHING, mode))
        if self.breaker.allows(self._clock()):
            self._contribute_soon()

    async def _send(
        self, ticket: Ticket, billed: Cost, mode: str, keep: Callable[[], None]
    ) -> bool:
        """Send an end to the store now; whether it got there. Else (the breaker skips the
        store, the call failed, or it was cancelled: shutdown) ``keep`` keeps it to send
        again."""
        if self.breaker.allows(self._clock()):
            try:
                async with self.slots:
                    await self._call(_op(mode), self.shared.finish(ticket, billed, mode))
            except STORE_ERRORS as exc:
                self._failed(_op(mode), exc)
            except BaseException:
                keep()
                raise
            else:
                return True
        keep()
        return False

    async def close(self) -> None:
        for task in (self._syncing, self._replaying):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.shared.client.aclose()


def _crossed(ticket: Ticket, now: float) -> bool:
    """Whether a store reservation is settled after a budget period it was reserved in
    ended (a stream across midnight)."""
    return any(p.kind == "b" and not p.start <= now < p.span for p in getattr(ticket, "parts", ()))
