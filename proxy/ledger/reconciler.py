"""Reconciliation against the engine's own counters, continuously (the I/O side of
``proxy.ledger.windows``): tally what is journaled, read the upstream's counters every
``--reconcile-interval`` seconds at a quiet moment, journal one window per reading, and
publish the drift as metrics."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol, runtime_checkable

import structlog

from proxy.ledger.journal import JournalError
from proxy.ledger.records import UsageRecord
from proxy.ledger.windows import (
    CauseCode,
    EngineReading,
    SettledWindow,
    Tally,
    parse_engine_counters,
    settle,
)
from proxy.metrics import DriftMetrics

log = structlog.get_logger("proxy.ledger.reconciler")


class CountersUnavailable(Exception):
    """The upstream's counters could not be read (unreachable, no /metrics, an error)."""


class Traffic(Protocol):
    """The metered exchanges, as the reconciler sees them (kept by the serving side)."""

    @property
    def in_flight(self) -> int:
        """Exchanges that may still reach the upstream or record."""
        ...

    @property
    def started(self) -> int:
        """Exchanges started since the process began (monotonic)."""
        ...

    @property
    def failed(self) -> int:
        """Exchanges that reached the upstream and ended with an error status (monotonic)."""
        ...

    @property
    def refused(self) -> int:
        """Exchanges the proxy refused itself, never forwarded (a limit's 429, a 503, a
        400 for a field it cannot bill; monotonic): no engine work, so never a drift."""
        ...

    async def quiet(self) -> None:
        """Return once no exchange is in flight."""
        ...


@dataclass(frozen=True, slots=True)
class Taken:
    """The window's records, set aside at a quiet moment, and the traffic's counts then
    (monotonic). ``baseline``: the window cannot be claimed (a pod's worker exited in it,
    taking records it had not told): the reading only opens the next window."""

    tally: Tally
    failed: int
    refused: int
    baseline: bool = False


@runtime_checkable
class Takes(Protocol):
    """How a window is closed: wait for a quiet moment, take the window's records, then,
    once the engine's counters are read, keep them (nothing started since the take: the
    window closes with them) or give them back (the window carries on). One process's is
    its exchanges and the reconciler's tally; a pod's asks every worker."""

    async def quiet(self) -> None:
        """Return once no exchange is in flight (or soon after; ``take`` checks)."""
        ...

    async def take(self) -> Taken | None:
        """The window's records, set aside; None when an exchange is in flight."""
        ...

    async def keep(self, taken: Taken) -> bool:
        """True when nothing started since ``take`` (the records are the window's);
        otherwise they are given back and it is False."""
        ...

    def give_back(self, taken: Taken) -> None:
        """The window carries on with the records ``take`` set aside."""
        ...


class WindowJournal(Protocol):
    """Where a closed window is journaled (one process's journal; a pod's worker 0)."""

    async def append(self, record: SettledWindow) -> None: ...


class Reconciler:
    """Knows what was recorded since the last quiet reading of the engine's counters."""

    def __init__(
        self,
        traffic: Traffic | Takes,
        read_counters: Callable[[], Awaitable[str]],
        journal: WindowJournal | None,
        metrics: DriftMetrics,
        *,
        interval: float,
        instance: str,
        upstream: str,
        shared: bool = False,
    ) -> None:
        self._takes = traffic if isinstance(traffic, Takes) else _Local(traffic, self)
        self._shared = shared  # other proxies send to the same engine
        self._read_counters = read_counters
        self._journal = journal
        self._metrics = metrics
        self._interval = interval
        self._instance = instance
        self._upstream = upstream
        self.tally = Tally()
        self.last: EngineReading | None = None
        self._last_at = datetime.now(UTC)
        self._failed_mark = 0
        self._refused_mark = 0
        self.windows: list[SettledWindow] = []  # this process's windows, newest last

    def account(self, record: UsageRecord) -> None:
        """A record was journaled: it is billed in the current window."""
        self.tally.add(record)

    def set_aside(self) -> Tally:
        """The window's records so far, taken to close it; the tally starts anew."""
        tally, self.tally = self.tally, Tally()
        return tally

    def carry(self, tally: Tally) -> None:
        """Records set aside and given back: the window carries on with them."""
        self.tally.merge(tally)

    async def run(self) -> None:
        interval = self._interval
        failing: str | None = None
        while True:
            await asyncio.sleep(interval if self.last else min(interval, 1.0))
            try:
                await self.settle_once(patience=interval)
            except (CountersUnavailable, ValueError) as exc:
                # Said once per distinct cause (an upstream without /metrics would repeat
                # it every interval); usage_proxy_reconcile_last_settled_* shows the stall.
                if str(exc) != failing:
                    log.warning("reconcile_failed", error=str(exc))
                failing = str(exc)
            except Exception:  # reconciliation is an audit; it must never stop
                log.exception("reconcile_crashed")
            else:
                failing = None

    async def settle_once(self, patience: float = 5.0) -> SettledWindow | None:
        """Close the window at the next quiet moment (within ``patience`` seconds);
        None when there was none (the window carries on) or this is the first reading."""
        deadline = time.monotonic() + patience
        while True:
            remaining = deadline - time.monotonic()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(remaining, 0)):
                    await self._takes.quiet()
            taken = await self._takes.take()
            if taken is None:
                return None
            ended = datetime.now(UTC)
            try:
                reading = parse_engine_counters(await self._read_counters())
            except BaseException:
                self._takes.give_back(taken)  # no reading: the records stay in the window
                raise
            if await self._takes.keep(taken):
                tally = taken.tally
                tally.traffic(taken.failed - self._failed_mark, taken.refused - self._refused_mark)
                self._failed_mark, self._refused_mark = taken.failed, taken.refused
                if taken.baseline:
                    self.last = None
                return await self._close(reading, tally, ended)
            if time.monotonic() >= deadline:  # traffic arrived while reading: not a boundary
                return None

    async def _close(
        self, reading: EngineReading, tally: Tally, ended: datetime
    ) -> SettledWindow | None:
        before, self.last = self.last, reading
        started_at, self._last_at = self._last_at, ended
        if before is None:
            return None  # the baseline: what happened before it is not this proxy's window
        window = settle(
            before,
            reading,
            tally,
            start=started_at,
            end=ended,
            instance=self._instance,
            upstream=self._upstream,
            shared=self._shared,
        )
        self._observe(window, reading)
        self.windows = [*self.windows[-99:], window]
        await self.record(window)
        if window.unbilled_prompt_tokens or window.overbilled_prompt_tokens:
            log.warning("reconcile_drift", **_summary(window))
        else:
            log.debug("reconcile_settled", **_summary(window))
        return window

    async def record(self, window: SettledWindow) -> None:
        """Journal a closed window (a failure is logged: the window stays in ``windows``)."""
        if self._journal is not None:
            try:
                await self._journal.append(window)
            except JournalError as exc:
                log.error("reconcile_window_not_journaled", error=str(exc))

    def _observe(self, window: SettledWindow, reading: EngineReading) -> None:
        m = self._metrics
        grown_p = window.engine_prompt_tokens
        grown_c = window.engine_completion_tokens
        # After a restart the counter's value is what the new engine has done so far.
        m.engine_prompt.inc(reading.prompt if grown_p is None else grown_p)
        m.engine_completion.inc(reading.generation if grown_c is None else grown_c)
        if any(cause.code is CauseCode.BILLED_IN_SECONDS for cause in window.causes):
            # Whole transcriptions are billed in seconds; the engine counts their tokens.
            # No token bill can match them, so they are not drift (nor the drift alert's).
            m.unbilled_in_seconds.labels("prompt").inc(window.unbilled_prompt_tokens)
            m.unbilled_in_seconds.labels("completion").inc(window.unbilled_completion_tokens)
        else:
            m.unbilled_prompt.inc(window.unbilled_prompt_tokens)
            m.unbilled_completion.inc(window.unbilled_completion_tokens)
        m.overbilled_prompt.inc(window.overbilled_prompt_tokens)
        m.overbilled_completion.inc(window.overbilled_completion_tokens)
        m.windows.labels(window.status).inc()
        m.last_settled.set(window.end.timestamp())


class _Local:
    """One process's ``Takes``: its exchanges, and the tally its recorder feeds."""

    def __init__(self, traffic: Traffic, reconciler: Reconciler) -> None:
        self._traffic, self._reconciler, self._mark = traffic, reconciler, 0

    async def quiet(self) -> None:
        await self._traffic.quiet()

    async def take(self) -> Taken | None:
        traffic = self._traffic
        if traffic.in_flight:
            return None
        self._mark = traffic.started
        return Taken(self._reconciler.set_aside(), traffic.failed, traffic.refused)

    async def keep(self, taken: Taken) -> bool:
        if self._traffic.started == self._mark:
            return True
        self.give_back(taken)
        return False

    def give_back(self, taken: Taken) -> None:
        self._reconciler.carry(taken.tally)


def _summary(window: SettledWindow) -> dict[str, object]:
    return {
        "window_id": window.window_id,
        "status": window.status,
        "engine": window.engine_prompt_tokens,
        "billed": window.billed_prompt_tokens,
        "unbilled": window.unbilled_prompt_tokens,
        "overbilled": window.overbilled_prompt_tokens,
        "causes": [cause.code.value for cause in window.causes],
    }
