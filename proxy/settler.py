"""Reconciliation against the engine's own counters, continuously (the I/O side of
``proxy.settlement``): count exchanges in flight, tally what is journaled, read the
upstream's ``/metrics`` every ``--reconcile-interval`` seconds at a quiet moment, journal
one window per reading, and publish the drift as metrics."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime

import aiohttp
import structlog
from aiohttp import web

from proxy.journal import Journal, JournalError
from proxy.metrics import METRICS, Metrics
from proxy.records import UsageRecord
from proxy.settings import Settings
from proxy.settlement import EngineReading, SettledWindow, Tally, parse_engine_counters, settle
from proxy.upstream import SESSION, UpstreamError, translated

log = structlog.get_logger("proxy.settler")


class Settler:
    """Knows what is in flight and what was recorded since the last quiet reading."""

    def __init__(self, settings: Settings, journal: Journal | None, metrics: Metrics) -> None:
        self._settings = settings
        self._journal = journal
        self._metrics = metrics
        self.in_flight = 0
        self.started = 0
        self.tally = Tally()
        self.last: EngineReading | None = None
        self._last_at = datetime.now(UTC)
        self.windows: list[SettledWindow] = []  # this process's windows, newest last
        self._quiet = asyncio.Event()
        self._quiet.set()

    def begin(self) -> None:
        """A metered exchange is about to reach the upstream."""
        self.in_flight += 1
        self.started += 1
        self._quiet.clear()

    def end(self, status: int) -> None:
        """It is over (its record, if any, is already accounted)."""
        self.in_flight -= 1
        if not self.in_flight:
            self._quiet.set()
        if status >= 400:
            self.tally.upstream_errors += 1

    def account(self, record: UsageRecord) -> None:
        """A record was journaled: it is billed in the current window."""
        self.tally.add(record)

    async def run(self, session: aiohttp.ClientSession) -> None:
        interval = self._settings.reconcile_interval
        failing: str | None = None
        while True:
            await asyncio.sleep(interval if self.last else min(interval, 1.0))
            try:
                await self.settle_once(session, patience=interval)
            except (UpstreamError, ValueError) as exc:
                # Said once per distinct cause (an upstream without /metrics would repeat
                # it every interval); usage_proxy_reconcile_last_settled_* shows the stall.
                if str(exc) != failing:
                    log.warning("reconcile_failed", error=str(exc))
                failing = str(exc)
            except Exception:  # reconciliation is an audit; it must never stop
                log.exception("reconcile_crashed")
            else:
                failing = None

    async def settle_once(
        self, session: aiohttp.ClientSession, patience: float = 5.0
    ) -> SettledWindow | None:
        """Close the window at the next quiet moment (within ``patience`` seconds);
        None when there was none (the window carries on) or this is the first reading."""
        deadline = time.monotonic() + patience
        while True:
            remaining = deadline - time.monotonic()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._quiet.wait(), max(remaining, 0))
            if self.in_flight:
                return None
            tally, self.tally, mark = self.tally, Tally(), self.started
            ended = datetime.now(UTC)
            reading = await self._read(session)
            if self.started == mark:
                return await self._close(reading, tally, ended)
            self.tally.merge(tally)  # traffic arrived while reading: not a boundary
            if time.monotonic() >= deadline:
                return None

    async def _read(self, session: aiohttp.ClientSession) -> EngineReading:
        url = self._settings.upstream_base + self._settings.reconcile_metrics_path
        with translated(url):
            async with session.get(url, allow_redirects=False) as response:
                response.raise_for_status()
                text = await response.text()
        return parse_engine_counters(text)

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
            instance=self._settings.instance,
            upstream=self._settings.upstream_base,
        )
        self._observe(window, reading)
        self.windows = [*self.windows[-99:], window]
        if self._journal is not None:
            try:
                await self._journal.append(window)
            except JournalError as exc:
                log.error("reconcile_window_not_journaled", error=str(exc))
        if window.unbilled_prompt_tokens or window.overbilled_prompt_tokens:
            log.warning("reconcile_drift", **_summary(window))
        else:
            log.debug("reconcile_settled", **_summary(window))
        return window

    def _observe(self, window: SettledWindow, reading: EngineReading) -> None:
        m = self._metrics
        grown_p = window.engine_prompt_tokens
        grown_c = window.engine_completion_tokens
        # After a restart the counter's value is what the new engine has done so far.
        m.engine_prompt.inc(reading.prompt if grown_p is None else grown_p)
        m.engine_completion.inc(reading.generation if grown_c is None else grown_c)
        m.unbilled_prompt.inc(window.unbilled_prompt_tokens)
        m.overbilled_prompt.inc(window.overbilled_prompt_tokens)
        m.unbilled_completion.inc(window.unbilled_completion_tokens)
        m.overbilled_completion.inc(window.overbilled_completion_tokens)
        m.windows.labels(window.status).inc()
        m.last_settled.set(window.end.timestamp())


def _summary(window: SettledWindow) -> dict[str, object]:
    return {
        "window_id": window.window_id,
        "status": window.status,
        "engine": window.engine_prompt_tokens,
        "billed": window.billed_prompt_tokens,
        "unbilled": window.unbilled_prompt_tokens,
        "overbilled": window.overbilled_prompt_tokens,
        "causes": window.causes,
    }


SETTLER = web.AppKey("settler", Settler)


def settler_context(settings: Settings) -> Callable[[web.Application], AsyncIterator[None]]:
    """cleanup_ctx: the settler and its task (none when --reconcile-interval is 0)."""
    from proxy.metering import METER

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        settler = app[SETTLER] = Settler(settings, app[METER].journal, app[METRICS])
        app[METER].settler = settler
        if settings.reconcile_interval <= 0:
            yield
            return
        task = asyncio.create_task(settler.run(app[SESSION]), name="reconcile")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    return ctx
