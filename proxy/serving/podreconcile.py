"""The pod's reconciler (docs/workers.md, "Reconciliation"): today's ``Reconciler`` runs
in the supervisor, with ``PodTraffic``, which asks every worker over its control
connection, and the windows go to worker 0, which journals and exports them.

A window is closed only when every worker of the pod answered the take, none had an
exchange in flight, and none started one while the engine's counters were read. A worker
that exits (or is replaced) in a window loses the records it had not told: that window is
abandoned, and the next quiet reading is a new baseline (no window claims traffic it did
not see)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp

from proxy.ledger.journal import JournalError
from proxy.ledger.reconciler import Reconciler, Taken
from proxy.ledger.windows import SettledWindow, Tally
from proxy.metrics import PodDriftMetrics
from proxy.serving.control import Message, encode
from proxy.serving.lifetimes import counters_reader
from proxy.settings import Settings

ASK_SECONDS = 5.0  # a worker's loop answers in milliseconds; a journal commit in less


@dataclass(slots=True)
class _Link:
    pid: int
    writer: asyncio.StreamWriter


@dataclass(slots=True)
class _Attempt:
    """One take: who answered (index → pid) with how many exchanges started."""

    mark: int
    exits: int
    started: dict[int, tuple[int, int]] = field(default_factory=dict)


class PodTraffic:
    """The reconciler's ``Takes`` for a pod: each step asks every worker."""

    def __init__(self, size: int, patience: float = ASK_SECONDS) -> None:
        self._size, self._patience = size, patience
        self._links: dict[int, _Link] = {}
        self._waiting: dict[int, tuple[int, asyncio.Future[Message]]] = {}
        self._seq = 0
        self._exits = self._kept_exits = 0
        self._attempt: _Attempt | None = None
        # The pod's failed and refused exchanges, monotonic across worker restarts.
        self._counts: dict[int, tuple[int, int, int]] = {}  # index → (pid, failed, refused)
        self.failed = self.refused = 0

    def joined(self, index: int, pid: int, writer: asyncio.StreamWriter) -> None:
        """Worker ``index`` (``pid``) said hello on ``writer``."""
        self._links[index] = _Link(pid, writer)

    def left(self, index: int, pid: int) -> None:
        """Its connection closed: what it was asked goes unanswered."""
        link = self._links.get(index)
        if link is not None and link.pid == pid:
            del self._links[index]
        for seq, (asked, answer) in list(self._waiting.items()):
            if asked == index and not answer.done():
                answer.set_exception(ConnectionError(f"worker {index} left"))
                del self._waiting[seq]

    def exited(self) -> None:
        """A worker exited: the window it was in can no longer be claimed."""
        self._exits += 1

    def answered(self, message: Message) -> None:
        """A worker's answer to one of the asks below."""
        seq = message.get("seq")
        waiting = self._waiting.pop(seq, None) if isinstance(seq, int) else None
        if waiting is not None and not waiting[1].done():
            waiting[1].set_result(message)

    async def quiet(self) -> None:
        await self._ask_all({"op": "quiet"}, bounded=False)

    async def take(self) -> Taken | None:
        self._seq += 1
        attempt = _Attempt(self._seq, self._exits)
        answers = await self._ask_all({"op": "take", "mark": attempt.mark})
        if answers is None or any(a.get("in_flight") for a in answers.values()):
            self._tell_all({"op": "give_back", "mark": attempt.mark})
            return None
        tally = Tally()
        for index, answer in answers.items():
            tally.merge(Tally(**answer["tally"]))
            attempt.started[index] = (answer["pid"], answer["started"])
            self._count(index, answer)
        self._attempt = attempt
        return Taken(tally, self.failed, self.refused, baseline=attempt.exits != self._kept_exits)

    async def keep(self, taken: Taken) -> bool:
        attempt = self._attempt
        answers = await self._ask_all({"op": "peek"})
        if attempt is None or answers is None or attempt.exits != self._exits:
            self.give_back(taken)
            return False
        now = {index: (a["pid"], a["started"]) for index, a in answers.items()}
        if now != attempt.started:
            self.give_back(taken)
            return False
        self._tell_all({"op": "confirm", "mark": attempt.mark})
        self._kept_exits = attempt.exits
        return True

    def give_back(self, taken: Taken) -> None:
        if self._attempt is not None:
            self._tell_all({"op": "give_back", "mark": self._attempt.mark})

    async def append(self, record: SettledWindow) -> None:
        """A closed window goes to worker 0, which journals it in its shard (and so
        exports it); ``JournalError`` when it did not say it had."""
        window = {"op": "window", "window": record.model_dump(mode="json")}
        answers = await self._ask({0: self._links[0]} if 0 in self._links else {}, window)
        if answers is None or not answers[0].get("ok"):
            raise JournalError("worker 0 did not journal the window (it was not connected)")

    def _count(self, index: int, answer: Message) -> None:
        pid, failed, refused = self._counts.get(index, (answer["pid"], 0, 0))
        if pid != answer["pid"]:  # a new worker at this index counts from 0
            failed = refused = 0
        self.failed += answer["failed"] - failed
        self.refused += answer["refused"] - refused
        self._counts[index] = (answer["pid"], answer["failed"], answer["refused"])

    async def _ask_all(self, body: Message, bounded: bool = True) -> dict[int, Message] | None:
        """Every worker's answer, or None when one is not connected or did not answer."""
        if len(self._links) < self._size:
            return None
        return await self._ask(dict(self._links), body, bounded)

    async def _ask(
        self, links: dict[int, _Link], body: Message, bounded: bool = True
    ) -> dict[int, Message] | None:
        if not links:
            return None
        loop = asyncio.get_running_loop()
        asked: dict[int, asyncio.Future[Message]] = {}
        for index, link in links.items():
            self._seq += 1
            asked[self._seq] = answer = loop.create_future()
            self._waiting[self._seq] = (index, answer)
            link.writer.write(encode({**body, "seq": self._seq}))
        try:
            async with asyncio.timeout(self._patience if bounded else None):
                answers = await asyncio.gather(*asked.values())
        except (TimeoutError, ConnectionError):
            return None
        finally:
            for seq in asked:
                self._waiting.pop(seq, None)
        # Who answered is the worker that said hello on the link (its pid).
        return {
            index: {**a, "pid": links[index].pid} for index, a in zip(links, answers, strict=True)
        }

    def _tell_all(self, body: Message) -> None:
        for link in self._links.values():
            if not link.writer.is_closing():
                link.writer.write(encode(body))


@contextlib.asynccontextmanager
async def pod_reconciler(settings: Settings, traffic: PodTraffic) -> AsyncIterator[None]:
    """The pod's reconciler's task, with the supervisor's own session for the engine's
    counters (none when --reconcile-interval is 0)."""
    if settings.reconcile_interval <= 0:
        yield
        return
    timeout = aiohttp.ClientTimeout(
        total=None, connect=settings.connect_timeout, sock_read=settings.read_timeout
    )
    async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as session:
        url = settings.upstream_base + settings.reconcile_metrics_path
        reconciler = Reconciler(
            traffic,
            counters_reader(lambda: session, url),
            traffic,
            PodDriftMetrics(settings),
            interval=settings.reconcile_interval,
            instance=settings.instance,
            upstream=settings.upstream_base,
            shared=settings.reconcile_shared_upstream,
        )
        task = asyncio.create_task(reconciler.run(), name="reconcile")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
