"""The shared limits store's accounting through faults, against the real redis-server:
messages lost or late, a store restarted empty or kept alive by the heartbeat, a settlement
across a period's end or cancelled, a rebuild and a second outage (each test a defect found
by a review, a strict xfail until it was fixed).

``Relay`` stands between the limiter and the store and models the network: what the
limiter sends can be ``lost`` (never reaches the store) or ``late`` (reaches it after the
limiter gave up on its answer: the store does the work, the answer is lost), for the
chunks that contain ``match`` only (the others pass at once)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from redis.asyncio import Redis

from proxy.limits.limiter import Cost, Who
from proxy.limits.policy import FailMode, Policies
from proxy.limitstore.guard import GuardedLimiter
from tests.support.limitstores import (
    ACME,
    Guards,
    charge,
    cut_off,
    policies,
    spend_locally,
    three_after_290,
)
from tests.support.redisserver import Store

Make = Callable[..., GuardedLimiter]


class Relay:
    """A TCP relay to the store that can lose or delay what the limiter sends."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.mode: str | None = None  # None, "lost" or "late"
        self.match = b""  # only chunks containing this are lost or late
        self.delay = 0.0  # how late a late chunk reaches the store
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        with contextlib.suppress(asyncio.CancelledError, OSError):
            await self._pump(reader, writer)
        self._tasks.discard(task)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)

        async def down() -> None:
            with contextlib.suppress(Exception):
                while data := await up_reader.read(65536):
                    writer.write(data)
                    await writer.drain()
            writer.close()

        answers = asyncio.create_task(down())
        try:
            with contextlib.suppress(Exception):
                while data := await reader.read(65536):
                    mode = self.mode if self.match in data else None
                    if mode == "lost":
                        continue
                    if mode == "late":  # still delivered, after the limiter gave up
                        await asyncio.sleep(self.delay)
                    up_writer.write(data)
                    await up_writer.drain()
                await asyncio.sleep(0.05)  # the store reads what was sent before the close
        finally:
            answers.cancel()
            for each in (up_writer, writer):
                each.close()
            with contextlib.suppress(BaseException):
                await answers
            for each in (up_writer, writer):
                with contextlib.suppress(BaseException):
                    await each.wait_closed()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()


@pytest.fixture
async def relay(redis_store: Store) -> AsyncIterator[Relay]:
    made = Relay(redis_store.port)
    await made.start()
    yield made
    await made.close()


@pytest.fixture
async def make(redis_store: Store, relay: Relay) -> AsyncIterator[Make]:
    guards = Guards()

    def build(pols: Policies, replica: str, *, via: str = "", **options: Any) -> GuardedLimiter:
        url = relay.url if via == "relay" else redis_store.url
        return guards.build(url, pols, replica, **options)

    yield build
    await guards.close()


async def warm(limiter: GuardedLimiter) -> None:
    """Every script loaded in the store (a later EVALSHA does not carry its text), the
    generation complete."""
    await limiter.restore([], time.time())
    assert await limiter.contribute() is True
    other = Who("acme", "m", "warmup")
    decision = await limiter.reserve(other, Cost(0, 0), time.time())
    assert decision.ticket is not None
    await limiter.release(decision.ticket, time.time())


async def test_a_request_in_flight_when_the_store_restarts_empty_still_holds(
    make: Make, redis_store: Store
) -> None:
    """100 tokens a day, two replicas: r0 reserves all 100 through the store; the store
    restarts empty and both contribute (the generation is complete); r1 must be refused
    100 more while r0's request runs (else both bill 100: 200 of a 100 budget)."""
    pols = policies(prompt_tokens_per_day=100)
    r0, r1 = make(pols, "r0", replicas=2), make(pols, "r1", replicas=2)
    for replica in (r0, r1):
        await replica.restore([], time.time())
    await r0.contribute()  # (restore began it: it may be whole already)
    assert await r1.contribute() is True
    first = await r0.reserve(ACME, Cost(100, 0), time.time())
    assert first.ticket is not None
    redis_store.kill()
    redis_store.start()
    whole = False
    for _ in range(3):  # the first call after the restart may meet a dead connection
        for replica in (r0, r1):
            replica.calls.breaker.count, replica.calls.breaker.open_until = 0, 0.0
            whole = await replica.contribute() or whole
        if whole:
            break
    assert whole
    second = await r1.reserve(ACME, Cost(100, 0), time.time())
    await r0.settle(first.ticket, Cost(100, 0), time.time())
    if second.ticket is not None:
        await r1.settle(second.ticket, Cost(100, 0), time.time())
    assert second.ticket is None, "admitted 200 of a 100-token budget"


async def test_a_reservation_whose_answer_was_lost_does_not_hold_the_gate(
    make: Make, relay: Relay
) -> None:
    """concurrency 1: an admission times out (its script reaches the store late: the store
    reserves, the answer is lost) and is admitted by the local share; it ends. Once the
    store answers again the tenant's next request must be admitted, not refused by the
    hold of a reservation no request owns (600 s, the TTL)."""
    limiter = make(policies(concurrency=1), "r0", via="relay", replicas=1, timeout=0.2)
    await warm(limiter)
    relay.mode, relay.match, relay.delay = "late", b"", 0.4
    lost = await limiter.reserve(ACME, Cost(0, 0), time.time())
    assert lost.ticket is not None  # by the local share, after the timeout
    assert limiter.calls.errors == {"timeout": 1}
    relay.mode = None
    await asyncio.sleep(0.6)  # the script has reached the store: it reserved
    await limiter.release(lost.ticket, time.time())
    after = await limiter.reserve(ACME, Cost(0, 0), time.time())
    assert limiter.calls.errors == {"timeout": 1}  # the store answered this one
    assert after.ticket is not None, after.refusal


async def test_a_late_settlement_after_the_contribution_counts_once(
    make: Make, relay: Relay, redis_store: Store
) -> None:
    """300 tokens a day: a reservation of 40 is settled at 30; the settlement's packet is
    late (a retransmission, > the 0.2 s timeout), so the replica counts it in its total
    and contributes that; then the settlement lands and adds 30 again: the budget is
    charged 60 for 30 billed, for the rest of the period (contributions only raise)."""
    limiter = make(policies(prompt_tokens_per_day=300), "r0", via="relay", replicas=1, timeout=0.2)
    await warm(limiter)
    decision = await limiter.reserve(ACME, Cost(40, 0), time.time())
    assert decision.ticket is not None
    relay.mode, relay.match, relay.delay = "late", b"settle", 0.5
    await limiter.settle(decision.ticket, Cost(30, 0), time.time())
    assert limiter.replay.missed  # timed out: kept to send again, late
    assert await limiter.contribute() is True  # carries the 30 in this replica's total
    await asyncio.sleep(0.7)  # the first sending reaches the store
    relay.mode = None
    await limiter.replay.replay(None)
    assert not limiter.replay.missed
    assert await charge(redis_store, limiter) == [30, 0]


async def test_a_missed_release_survives_an_admission_timeout(make: Make, relay: Relay) -> None:
    """concurrency 1: a release is lost on the way (kept to send again); the tenant's next
    admission replays it inline and times out while doing so. Once the store answers, the
    tenant's next request must be admitted: the release must still be kept (before: gone
    from ``missed``, the hold stays until its TTL, 600 s)."""
    limiter = make(policies(concurrency=1), "r0", via="relay", replicas=1, timeout=0.2)
    await warm(limiter)
    first = await limiter.reserve(ACME, Cost(0, 0), time.time())
    assert first.ticket is not None
    relay.mode, relay.match = "lost", b""
    await limiter.release(first.ticket, time.time())
    assert len(limiter.replay.missed) == 1
    during = await limiter.reserve(ACME, Cost(0, 0), time.time())  # replays, times out
    assert during.ticket is not None  # by the local share
    relay.mode = None
    await limiter.release(during.ticket, time.time())
    after = await limiter.reserve(ACME, Cost(0, 0), time.time())
    assert after.ticket is not None, (after.refusal, limiter.replay.missed)


async def test_a_settlement_across_the_period_end_counts_in_the_new_period(
    make: Make,
) -> None:
    """100 tokens a day, two replicas: r0 reserves 60 one second before the day ends and
    settles them one second after (a stream across midnight): its journal bills them
    today. r1 must then be refused 100 of today's budget; it is admitted, and once r0's
    next reservation carries its total the store charges 160 of 100."""
    pols = policies(prompt_tokens_per_day=100)
    r0, r1 = make(pols, "r0", replicas=2), make(pols, "r1", replicas=2)
    for replica in (r0, r1):
        await replica.restore([], time.time())
    await r0.contribute()  # (restore began it: it may be whole already)
    await r1.contribute()  # (the one restore began may have landed before r0's)
    assert await r1.contribute() is True
    (part,) = [p for p in r0.shared.parts(ACME, time.time()) if p.kind == "b"]
    before, after = part.span - 1, part.span + 1  # the period's end, on both sides
    decision = await r0.reserve(ACME, Cost(60, 0), before)
    assert decision.ticket is not None
    await r0.settle(decision.ticket, Cost(60, 0), after)
    assert r0.shared.book.history.used(part.scope, part.limit.unit, part.span, part.span + 86_400)
    other = await r1.reserve(ACME, Cost(100, 0), after)
    assert other.ticket is None, "r1 admitted 100 of a budget r0 already billed 60 of"


async def test_the_heartbeat_keeps_the_generation_alive(make: Make, redis_store: Store) -> None:
    """The generation marker's TTL is 40 days; before, only a contribution refreshed it,
    and nothing makes a healthy replica contribute again, so a store that never failed
    lost it 40 days after the last contribution: a spurious rebuild (closed tenants 503
    until every replica contributed again). A heartbeat now refreshes it (here: a marker
    with 10 s left is given its 40 days again; a marker that is gone stays gone)."""
    pols = Policies.model_validate(
        {"tenants": {"acme": {"prompt_tokens_per_day": 100, "fail_mode": "closed"}}}
    )
    r0 = make(pols, "r0", replicas=1)
    await r0.restore([], time.time())
    assert await r0.contribute() is True
    key = r0.shared.keys.generation
    client = Redis.from_url(redis_store.url)
    try:
        await client.expire(key, 10)  # as 40 days after the last contribution, less 10 s
        await r0.beat(15)
        assert await client.ttl(key) > 39 * 86_400
        await client.delete(key)
        await r0.beat(15)  # it contributes again: a new generation (a store found empty)
        assert r0.contribution.rebuilds == 2
    finally:
        await client.aclose()


async def test_a_settlement_cancelled_before_it_is_sent_still_counts(
    make: Make, redis_store: Store
) -> None:
    """300 tokens a day, one store slot, a 0.3 s reservation TTL: a reservation of 100 is
    settled at 100, but the settling task is cancelled while the slot is busy. The 100
    billed (in the journal) must reach the store: after the contribution and the hold's
    TTL the budget must show 100 used (before: 0, and 300 more are admitted)."""
    limiter = make(policies(prompt_tokens_per_day=300), "r0", replicas=1, slots=1)
    limiter.shared.reservation_ttl = 0.3
    await limiter.restore([], time.time())
    assert await limiter.contribute() is True
    decision = await limiter.reserve(ACME, Cost(100, 0), time.time())
    assert decision.ticket is not None
    await limiter.calls.slots.acquire()  # the one slot busy
    settling = asyncio.create_task(limiter.settle(decision.ticket, Cost(100, 0), time.time()))
    await asyncio.sleep(0.01)
    settling.cancel()  # e.g. the exchange's task cancelled
    with contextlib.suppress(asyncio.CancelledError):
        await settling
    limiter.calls.slots.release()
    await asyncio.sleep(0.4)  # the settlement's hold expires by its TTL
    assert await limiter.contribute() is True
    after = await limiter.reserve(ACME, Cost(0, 0), time.time())
    assert after.tokens is not None
    assert after.tokens.remaining == 200, (after.tokens, limiter.shared.book.sending)


async def test_the_rebuild_keeps_the_total_within_the_budget(
    make: Make, redis_store: Store
) -> None:
    """Three replicas share 300 tokens a day; r0 billed 290 of them through the store and
    every heartbeat ran after it (each replica knows 10 are left). The store restarts
    empty; while the generation waits for r2's part, r0 and r1 admit by their share on
    the store: together they may admit at most the 10 left (before: r1 alone 100)."""
    replicas = await three_after_290(make, policies(prompt_tokens_per_day=300))
    redis_store.kill()
    redis_store.start()
    for replica in replicas[:2]:  # r2's heartbeat has not come round yet
        for _ in range(3):  # the first call after the restart may meet a dead connection
            replica.calls.breaker.count, replica.calls.breaker.open_until = 0, 0.0
            assert await replica.contribute() is False  # incomplete: r2 not yet
            if replica.calls.reachable:
                break
    admitted = 0
    for replica in replicas[:2]:
        for _ in range(10):
            decision = await replica.reserve(ACME, Cost(10, 0), time.time())
            admitted += 10 if decision.ticket is not None else 0
    assert replicas[1].mode.fail_admissions[FailMode.LOCAL] > 0  # by the share: rebuilding
    assert 290 + admitted <= 300, f"{admitted} admitted while the store was rebuilt"


async def test_a_second_outage_does_not_spend_what_the_first_spent(
    make: Make,
) -> None:
    """300 tokens a day, three replicas; the heartbeats read 300 left. Outage 1: each
    admits its 100 locally (the budget is spent). The store answers r0 and r2 again for
    a moment: each contributes and its heartbeat reads what is left, in turn; r1 has not
    contributed yet (its heartbeat not come round). Outage 2: nothing is left, so nothing
    more may be admitted (before: r0 read 200 left, r1's and r2's 100 missing, r2 read
    100, r1's missing; they admit a third of those: 60 + 30, 390 of 300)."""
    pols = policies(prompt_tokens_per_day=300)
    replicas = [make(pols, f"r{i}", replicas=3) for i in range(3)]
    for replica in replicas:
        await replica.restore([], time.time())
        await replica.contribute()
    for replica in replicas:
        assert await replica.beat(15) is not None
        assert replica.mode.remainders.left  # the remainder each keeps for an outage
    for replica in replicas:
        cut_off(replica, True)
    first = sum([await spend_locally(replica) for replica in replicas])
    assert first == 300
    r0, _, r2 = replicas  # r1 stays cut off
    for replica in (r0, r2):  # back for a moment, for these two
        cut_off(replica, False)
        await replica.contribute()
        assert await replica.beat(15) is not None
        cut_off(replica, True)
    each = [await spend_locally(replica) for replica in replicas]
    second = sum(each)
    assert first + second <= 300, f"{first + second} admitted of 300 (outage 2: {each})"
