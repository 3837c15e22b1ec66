"""The reconciler's settle loop under cancellation (issue #28: a 300 s shutdown hang)."""

from __future__ import annotations

import asyncio

import pytest

from proxy.ledger.reconciler import Reconciler
from proxy.metrics import Metrics
from proxy.settings import Settings


class Traffic:
    """One exchange in flight until ``end`` is called."""

    def __init__(self) -> None:
        self._quiet = asyncio.Event()
        self.in_flight, self.started, self.failed, self.refused = 1, 1, 0, 0

    def end(self) -> None:
        self.in_flight = 0
        self._quiet.set()

    async def quiet(self) -> None:
        await self._quiet.wait()


async def read_counters() -> str:
    """An upstream that never answers: a settle ends only by cancellation."""
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


@pytest.mark.parametrize("turns", range(6))
async def test_a_cancel_as_the_traffic_goes_quiet_ends_the_settle(turns: int) -> None:
    """Python 3.11's ``asyncio.wait_for`` drops a cancellation that arrives after the
    awaited future completed but before the waiting task resumed (bpo-42130). The
    reconciler waited for quiet traffic that way, so a shutdown that cancelled it at that
    moment left ``run()`` looping and the application's cleanup awaiting it forever. The
    cancel lands after each number of loop turns across that window; it must always win."""
    traffic = Traffic()
    reconciler = Reconciler(
        traffic,
        read_counters,
        None,
        Metrics(Settings(upstream="http://x")),
        interval=15,
        instance="test",
        upstream="http://x",
    )
    task = asyncio.create_task(reconciler.settle_once(patience=30))
    await asyncio.sleep(0)  # the settle now waits for quiet traffic
    traffic.end()
    for _ in range(turns):
        await asyncio.sleep(0)
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=5)
    assert done == {task}
    assert task.cancelled()
