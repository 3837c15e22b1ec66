"""A pod's worker as the pod's reconciliation sees it (its exchanges' counts, its
reconciler's tally, worker 0's shard), for tests of ``serving.podtally`` and
``serving.podreconcile`` without a worker process."""

from __future__ import annotations

import asyncio

from aiohttp import web

from proxy.ledger.reconciler import Reconciler
from proxy.ledger.windows import SettledWindow
from proxy.metrics import PodDriftMetrics
from proxy.serving.exchange import EXCHANGES
from proxy.serving.keys import RECONCILER
from proxy.settings import Settings
from tests.support.records import make_record

SETTINGS = Settings(upstream="http://x", reconcile_interval=1)


class Exchanges:
    """A worker's exchanges, as the desk reads them."""

    def __init__(self) -> None:
        self.in_flight = self.started = self.failed = self.refused = 0
        self._quiet = asyncio.Event()
        self._quiet.set()

    async def quiet(self) -> None:
        await self._quiet.wait()

    def serve(self, billed: int, reconciler: Reconciler) -> None:
        """One exchange that ran and was journaled with ``billed`` prompt tokens."""
        self.started += 1
        reconciler.account(make_record(self.started, billed=billed))


class Shard:
    """Worker 0's journal: what it was given."""

    def __init__(self) -> None:
        self.windows: list[SettledWindow] = []

    async def append(self, record: SettledWindow) -> None:
        self.windows.append(record)


class Worker:
    """A worker of the pod: its exchanges and its reconciler (which tallies), linked."""

    def __init__(self, index: int, pid: int) -> None:
        self.index, self.pid = index, pid
        self.exchanges, self.shard = Exchanges(), Shard()
        self.reconciler = Reconciler(
            self.exchanges, _never, self.shard, PodDriftMetrics(SETTINGS), interval=1,
            instance="w", upstream="u",
        )  # fmt: skip
        self.app = web.Application()
        self.app[RECONCILER], self.app[EXCHANGES] = self.reconciler, self.exchanges  # type: ignore[assignment]

    def serve(self, *billed: int) -> None:
        for tokens in billed:
            self.exchanges.serve(tokens, self.reconciler)

    @property
    def tallied(self) -> int:
        return self.reconciler.tally.prompt_billed


async def _never() -> str:
    raise AssertionError("a worker never reads the engine")
