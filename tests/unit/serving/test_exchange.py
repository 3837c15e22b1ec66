"""One exchange per request: it outlives a cancelled caller and fails a failed one."""

from __future__ import annotations

from typing import Any

import pytest


def _exchanges() -> Any:
    from aiohttp.test_utils import make_mocked_request

    from proxy.accounting.routes import BY_PATH
    from proxy.metrics import Metrics
    from proxy.serving.bodies import BodyBudget
    from proxy.serving.exchange import Exchange, Exchanges
    from proxy.serving.shares import TenantShares
    from proxy.serving.tenancy import Attribution
    from proxy.settings import Settings

    metrics = Metrics(Settings(upstream="http://127.0.0.1:9"))
    shares = TenantShares(8, 1024, 1.0, metrics)
    exchanges = Exchanges(BodyBudget(1024, 1024, 1.0), shares, metrics)
    request = make_mocked_request("POST", "/rerank")
    exchange = Exchange(request, BY_PATH["/rerank"], b"", 0, 0.0, Attribution("t", None))
    return exchanges, exchange


async def test_a_cancelled_handler_does_not_cancel_its_exchange() -> None:
    """The exchange outlives its caller (a client hang-up with handler cancellation, or a
    shutdown): it finishes, and shutdown can wait for it."""
    import asyncio

    from aiohttp import web

    (exchanges, exchange), finished = _exchanges(), asyncio.Event()

    async def work(_: Any) -> web.Response:
        await asyncio.sleep(0.05)
        finished.set()
        return web.Response(status=207)

    caller = asyncio.create_task(exchanges.run(exchange, work))
    await asyncio.sleep(0.01)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert not finished.is_set()
    assert exchanges.in_flight == 1
    await exchanges.finish(1.0)
    assert finished.is_set()
    assert exchanges.in_flight == 0
    assert (await exchanges.run(exchange, work)).status == 207


async def test_an_exchange_that_fails_fails_its_caller() -> None:
    """An exception in the work reaches the caller; the exchange ends, counted failed."""
    exchanges, exchange = _exchanges()

    async def work(_: Any) -> Any:
        raise LookupError("upstream gone")

    with pytest.raises(LookupError, match="upstream gone"):
        await exchanges.run(exchange, work)
    assert exchanges.in_flight == 0
    assert exchanges.failed == 1
