"""A pod's worker's end of the pod's reconciliation (``serving.podreconcile`` is the
supervisor's): it answers the supervisor's asks on the control connection from its
exchanges and its reconciler's tally, each at once on its loop, and worker 0 journals the
closed windows.

- ``quiet``: answered once no exchange is in flight;
- ``take`` (mark): its counts and its tally, which it sets aside (a new one starts);
- ``peek``: its counts again;
- ``confirm`` (mark): the tally set aside is the window's: dropped; ``give_back`` (mark):
  merged back into the current one, as one process does when a window carries on;
- ``window``: journal this closed window (worker 0), answered once it is."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Coroutine
from typing import Any

import structlog
from aiohttp import web
from pydantic import ValidationError

from proxy.ledger.windows import SettledWindow, Tally
from proxy.serving.exchange import EXCHANGES
from proxy.serving.keys import RECONCILER

log = structlog.get_logger("proxy.serving.podtally")
Message = dict[str, Any]
Answer = Callable[[Message], None]


class TallyDesk:
    """Answers the supervisor's reconciliation asks for one worker's application."""

    def __init__(self, app: web.Application, answer: Answer) -> None:
        self._reconciler, self._exchanges = app[RECONCILER], app[EXCHANGES]
        self._answer = answer
        self._aside: dict[int, Tally] = {}
        self._quiet: list[int] = []  # asks waiting for a quiet moment (one waiter)
        self._tasks: set[asyncio.Task[None]] = set()

    def handle(self, message: Message) -> bool:
        """Answer ``message`` when it is one of these asks; False otherwise."""
        op, seq, mark = message.get("op"), message.get("seq"), message.get("mark")
        if op == "quiet" and isinstance(seq, int):
            self._when_quiet(seq)
        elif op == "take" and isinstance(mark, int):
            self._answer({"seq": seq, **self._counts(), "tally": self._set_aside(mark)})
        elif op == "peek":
            self._answer({"seq": seq, **self._counts()})
        elif op == "confirm" and isinstance(mark, int):
            self._aside.pop(mark, None)
        elif op == "give_back" and isinstance(mark, int):
            self._merge_back(mark)
        elif op == "window":
            self._spawn(self._journal(seq, message.get("window")))
        else:
            return False
        return True

    def close(self) -> None:
        """The connection is gone: stop waiting; what was set aside goes back."""
        for task in self._tasks:
            task.cancel()
        for mark in list(self._aside):
            self._merge_back(mark)

    def _counts(self) -> Message:
        x = self._exchanges
        return {"in_flight": x.in_flight, "started": x.started} | {
            "failed": x.failed,
            "refused": x.refused,
        }

    def _set_aside(self, mark: int) -> Message:
        for earlier in list(self._aside):  # an attempt whose end never came: not lost
            self._merge_back(earlier)
        self._aside[mark] = tally = self._reconciler.set_aside()
        return dataclasses.asdict(tally)

    def _merge_back(self, mark: int) -> None:
        tally = self._aside.pop(mark, None)
        if tally is not None:
            self._reconciler.carry(tally)

    def _when_quiet(self, seq: int) -> None:
        self._quiet.append(seq)
        if len(self._quiet) == 1:
            self._spawn(self._quiet_then_answer())

    async def _quiet_then_answer(self) -> None:
        await self._exchanges.quiet()
        asks, self._quiet = self._quiet, []
        for seq in asks:
            self._answer({"seq": seq})

    async def _journal(self, seq: object, body: object) -> None:
        try:
            window = SettledWindow.model_validate(body)
        except ValidationError as exc:  # a defect, said; the worker serves on
            log.error("reconcile_window_unreadable", error=str(exc))
            self._answer({"seq": seq, "ok": False})
            return
        await self._reconciler.record(window)
        self._answer({"seq": seq, "ok": True})

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
