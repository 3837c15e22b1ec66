"""The pod's reconciler (``serving.podreconcile``): today's ``Reconciler`` with
``PodTraffic``, against workers whose end is the real ``TallyDesk``, over real Unix
socket pairs, as the supervisor's control loop passes their answers on."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest

from proxy.ledger.reconciler import Reconciler
from proxy.metrics import PodDriftMetrics
from proxy.serving.control import decode, encode
from proxy.serving.podreconcile import PodTraffic
from proxy.serving.podtally import TallyDesk
from tests.support.podworkers import SETTINGS, Worker


@contextlib.asynccontextmanager
async def linked(traffic: PodTraffic, worker: Worker) -> AsyncIterator[socket.socket]:
    """``worker`` on a control connection: the supervisor's end hands its answers to
    ``traffic`` (as ``Pod._connected`` does), the worker's end is its ``TallyDesk``.
    Yields the supervisor's socket (closing it is the worker's death)."""
    ours, theirs = socket.socketpair()
    s_reader, s_writer = await asyncio.open_unix_connection(sock=ours)
    w_reader, w_writer = await asyncio.open_unix_connection(sock=theirs)
    desk = TallyDesk(worker.app, lambda m: w_writer.write(encode({"op": "answer", **m})))
    traffic.joined(worker.index, worker.pid, s_writer)

    async def supervisor_end() -> None:
        try:
            while line := await s_reader.readline():
                if (message := decode(line)).get("op") == "answer":
                    traffic.answered(message)
        finally:
            traffic.left(worker.index, worker.pid)

    async def worker_end() -> None:
        try:
            while line := await w_reader.readline():
                desk.handle(decode(line))
        finally:
            desk.close()

    ends = [asyncio.create_task(supervisor_end()), asyncio.create_task(worker_end())]
    try:
        yield ours
    finally:
        s_writer.close()
        w_writer.close()
        await asyncio.gather(*ends, return_exceptions=True)


class Engine:
    """The engine's prompt counter, grown by the test; ``during`` runs while it is read."""

    def __init__(self) -> None:
        self.prompt = 1000
        self.during: Any = None

    async def read(self) -> str:
        if self.during is not None:
            self.during()
        return f"vllm:prompt_tokens_total {self.prompt}\nvllm:generation_tokens_total 0\n"


def pod_reconciler(traffic: PodTraffic, engine: Engine) -> Reconciler:
    return Reconciler(
        traffic, engine.read, traffic, PodDriftMetrics(SETTINGS), interval=1, instance="pod",
        upstream="u",
    )  # fmt: skip


@contextlib.asynccontextmanager
async def pod(size: int = 2) -> AsyncIterator[tuple[PodTraffic, list[Worker], Engine]]:
    """A pod of ``size`` linked workers, its traffic and the engine."""
    traffic = PodTraffic(size, patience=2)
    workers = [Worker(k, 100 + k) for k in range(size)]
    async with contextlib.AsyncExitStack() as links:
        for worker in workers:
            await links.enter_async_context(linked(traffic, worker))
        yield traffic, workers, Engine()


async def test_a_window_sums_every_workers_tally_and_worker_0_journals_it() -> None:
    """Records of both workers, the engine grown by their tokens: one window, matched,
    billed the sum, journaled once in worker 0's shard; each worker's tally starts anew."""
    async with pod() as (traffic, (w0, w1), engine):
        reconciler = pod_reconciler(traffic, engine)
        assert await reconciler.settle_once(patience=1) is None  # the baseline
        w0.serve(10, 20)
        w1.serve(5)
        engine.prompt += 35
        window = await reconciler.settle_once(patience=1)
        assert window is not None
        assert (window.records, window.billed_prompt_tokens) == (3, 35)
        assert window.unbilled_prompt_tokens == window.overbilled_prompt_tokens == 0
        assert w0.shard.windows == [window]
        assert w1.shard.windows == []
        assert w0.tallied == w1.tallied == 0


async def test_an_exchange_started_while_reading_gives_every_tally_back() -> None:
    """An exchange starts in worker 1 while the engine's counters are read: not a
    boundary. Both workers' records go back to their tallies (none lost), and the next
    quiet reading closes the window with all of them."""
    async with pod() as (traffic, (w0, w1), engine):
        reconciler = pod_reconciler(traffic, engine)
        await reconciler.settle_once(patience=1)
        w0.serve(10)
        w1.serve(7)
        engine.prompt += 17 + 4

        def one_more() -> None:
            engine.during = None
            w1.serve(4)

        engine.during = one_more
        assert await reconciler.settle_once(patience=0) is None
        await asyncio.sleep(0.05)  # the give-backs are written, not awaited
        assert (w0.tallied, w1.tallied) == (10, 11)
        window = await reconciler.settle_once(patience=1)
        assert window is not None
        assert window.billed_prompt_tokens == 21
        assert window.unbilled_prompt_tokens == 0


async def test_an_exchange_in_flight_in_one_worker_keeps_the_window_open() -> None:
    """Worker 1 has an exchange in flight: no window closes within the patience, and
    what was taken goes back."""
    async with pod() as (traffic, (w0, w1), engine):
        reconciler = pod_reconciler(traffic, engine)
        await reconciler.settle_once(patience=1)
        w0.serve(10)
        w1.exchanges.in_flight = 1
        w1.exchanges._quiet.clear()
        assert await reconciler.settle_once(patience=0.2) is None
        await asyncio.sleep(0.05)
        assert w0.tallied == 10


@pytest.mark.parametrize("how", ["exited", "left"])
async def test_a_worker_that_dies_in_a_window_abandons_it(how: str) -> None:
    """Worker 1 dies with records it never told (the engine did the work): the window is
    abandoned, the next reading is a new baseline, and the window after it claims only
    what followed, matched. While it is gone no window closes at all."""
    traffic = PodTraffic(2, patience=2)
    engine = Engine()
    w0, w1 = Worker(0, 100), Worker(1, 101)
    reconciler = pod_reconciler(traffic, engine)
    async with linked(traffic, w0), linked(traffic, w1) as socket_1:
        await reconciler.settle_once(patience=1)
        w0.serve(10)
        w1.serve(30)
        engine.prompt += 40
        socket_1.shutdown(socket.SHUT_RDWR) if how == "left" else traffic.exited()
        if how == "left":
            await asyncio.sleep(0.05)
            assert await reconciler.settle_once(patience=0.2) is None  # one not linked
            traffic.exited()
    replaced = Worker(1, 202)
    async with linked(traffic, w0), linked(traffic, replaced):
        assert await reconciler.settle_once(patience=1) is None  # a new baseline
        w0.serve(3)
        replaced.serve(4)
        engine.prompt += 7
        window = await reconciler.settle_once(patience=1)
    assert window is not None
    assert window.billed_prompt_tokens == 7
    assert window.unbilled_prompt_tokens == window.overbilled_prompt_tokens == 0


async def test_a_worker_that_never_answers_is_not_waited_for() -> None:
    """A worker linked but silent (its loop stuck): the take gives up after the patience
    and nothing closes."""
    traffic = PodTraffic(2, patience=0.2)
    engine = Engine()
    w0 = Worker(0, 100)
    ours, theirs = socket.socketpair()
    _, silent = await asyncio.open_unix_connection(sock=ours)
    async with linked(traffic, w0):
        traffic.joined(1, 101, silent)
        reconciler = pod_reconciler(traffic, engine)
        async with asyncio.timeout(5):
            assert await reconciler.settle_once(patience=0.5) is None
    silent.close()
    theirs.close()
