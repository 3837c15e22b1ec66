"""A worker's hosted limiter: one round trip per reservation, settlements in order
without waiting, and refusals (never admissions) once the host is gone."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from proxy.limits.limiter import Cost, Limiter, StandingUnknown, Usage, Who
from proxy.limits.policy import Policies
from proxy.limitstore.host import LimiterHost
from proxy.limitstore.hosted import HostedLimiter, HostedTicket, HostError
from proxy.limitstore.memory import InProcessLimiter

ACME = Who("acme", "m", "k1")
POLICIES = Policies.model_validate(
    {"tenants": {"acme": {"concurrency": 1, "prompt_tokens_per_day": 50}}}
)


@pytest.fixture
async def pod() -> AsyncIterator[tuple[LimiterHost, HostedLimiter]]:
    """A host on a short socket path (108 bytes at most) and one worker connected."""
    directory = Path(tempfile.mkdtemp(prefix="hosted-"))
    host = LimiterHost(InProcessLimiter(POLICIES), directory / "limiter.sock")
    await host.start()
    worker = await HostedLimiter.connect(host.path, POLICIES, 0)
    yield host, worker
    await worker.close()
    await host.close()
    shutil.rmtree(directory)


async def test_a_release_is_taken_before_the_next_reservation(
    pod: tuple[LimiterHost, HostedLimiter],
) -> None:
    """Settle and release are not waited for, yet never overtaken: with one slot, a
    release written just before the next reservation on the same connection frees it."""
    _, worker = pod
    now = time.time()
    for _ in range(5):
        decision = await worker.reserve(ACME, Cost(1, 0), now)
        assert isinstance(decision.ticket, HostedTicket)
        await worker.release(decision.ticket, now)
    last = await worker.reserve(ACME, Cost(10, 0), now)
    assert last.ticket is not None
    await worker.settle(last.ticket, Cost(7, 0), now)
    await worker.settle(last.ticket, Cost(7, 0), now)  # a ticket ends once
    standing = await worker.reserve(ACME, Cost(1, 0), now)
    assert standing.tokens is not None
    assert standing.tokens.remaining == 50 - 7 - 1


async def test_the_decision_carries_the_hosts_standings(
    pod: tuple[LimiterHost, HostedLimiter],
) -> None:
    """The headers need the standings: a hosted decision equals the one the in-process
    limiter gives for the same state, refusal included (its infinite wait too)."""
    _, worker = pod
    alone = InProcessLimiter(POLICIES)
    now = time.time()
    for cost in (Cost(20, 0), Cost(60, 0)):
        hosted = await worker.reserve(ACME, cost, now)
        local = await alone.reserve(ACME, cost, now)
        assert (hosted.refusal, hosted.tokens, hosted.budgets) == (
            local.refusal,
            local.tokens,
            local.budgets,
        )
        if hosted.ticket is not None and local.ticket is not None:
            await worker.release(hosted.ticket, now)
            await alone.release(local.ticket, now)
    assert hosted.refusal is not None
    assert hosted.refusal.alone


async def test_without_its_host_a_worker_refuses_limited_requests(
    pod: tuple[LimiterHost, HostedLimiter],
) -> None:
    """The host is gone (the supervisor was killed): a reservation waiting for its answer
    and every later one are refused as unavailable (503), never admitted unmetered;
    settling an old ticket does nothing and raises nothing."""
    host, worker = pod
    now = time.time()
    held = await worker.reserve(ACME, Cost(1, 0), now)
    assert held.ticket is not None
    waiting = asyncio.create_task(worker.reserve(ACME, Cost(1, 0), now))  # refused: 1 slot
    await host.close()
    assert (await waiting).ticket is None
    late = await worker.reserve(ACME, Cost(1, 0), now)
    assert late.ticket is None
    assert late.refusal is not None
    assert late.refusal.unavailable
    assert "limiter host is gone" in late.refusal.why
    await worker.settle(held.ticket, Cost(1, 0), now)


async def test_the_host_restores_not_the_worker(pod: tuple[LimiterHost, HostedLimiter]) -> None:
    """A worker's restore takes nothing (the host reads every shard before any worker
    starts); whether a tenant needs a cost is answered from the worker's own policies."""
    _, worker = pod
    assert await worker.restore([Usage(ACME, time.time(), Cost(5, 0))], time.time()) == 0
    assert worker.wants_tokens("acme")
    assert not worker.wants_tokens("globex")


async def test_a_worker_is_a_limiter_whose_readiness_follows_its_host(
    pod: tuple[LimiterHost, HostedLimiter],
) -> None:
    """The hosted limiter is the application's ``Limiter`` (a typed seam: mypy holds it):
    ready while its host answers, not ready once it is gone, when its standings are
    unknown (the usage API answers 503)."""
    host, worker = pod
    limiter: Limiter = worker
    assert not limiter.shared_store
    assert limiter.problem() is None
    await host.close()
    await worker.reserve(ACME, Cost(1, 0), time.time())  # learns the host is gone
    problem = limiter.problem()
    assert problem is not None
    assert problem[1] is True
    with pytest.raises(StandingUnknown, match="limiter host is gone"):
        await limiter.standing("acme", time.time())


async def test_a_standing_is_the_hosts_through_any_worker(
    pod: tuple[LimiterHost, HostedLimiter],
) -> None:
    """The usage API's standing is read on the host: what another worker holds and
    billed shows through this one, exactly as the host's own limiter tells it."""
    host, worker = pod
    other = await HostedLimiter.connect(host.path, POLICIES, 1)
    now = time.time()
    billed = await worker.reserve(ACME, Cost(9, 0), now)
    assert billed.ticket is not None
    await worker.settle(billed.ticket, Cost(4, 0), now)
    held = await other.reserve(ACME, Cost(10, 0), now)
    assert held.ticket is not None
    hosted = await worker.standing("acme", now)
    assert hosted == await host.limiter.standing("acme", now)
    day = next(s for s in hosted if s.limit.name == "prompt_tokens_per_day")
    assert (day.used, day.held, day.standing.remaining) == (4, 10, 50 - 4 - 10)
    gate = next(s for s in hosted if s.limit.name == "concurrency")
    assert gate.used == 1  # the other worker's request in flight
    await other.release(held.ticket, now)
    await other.close()


async def test_a_limiter_not_yet_connected_refuses_and_says_so() -> None:
    """Built before the worker's start-up connects it (the limits file holds it from
    construction): until then it admits nothing and fails readiness; a host that is not
    there is a ``HostError`` naming the socket."""
    path = Path(tempfile.mkdtemp(prefix="hosted-")) / "limiter.sock"
    limiter = HostedLimiter(POLICIES, path, 0)
    decision = await limiter.reserve(ACME, Cost(1, 0), time.time())
    assert decision.refusal is not None
    assert decision.refusal.unavailable
    assert limiter.problem() is not None
    with pytest.raises(HostError, match=str(path)):
        await limiter.open()
    shutil.rmtree(path.parent)
