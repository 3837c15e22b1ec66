"""The heartbeat on a real redis-server: the replica count it reads (replicas started
during an outage do not each get the whole budget), the holds it renews, and a store back
from an old snapshot rebuilt."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from redis.asyncio import Redis

from proxy.limits.limiter import Cost
from proxy.limitstore.guard import GuardedLimiter
from proxy.limitstore.headcount import CountFile
from proxy.limitstore.tickets import LocalTicket
from tests.support.limitstores import ACME, MakeGuarded, policies
from tests.support.redisserver import Store


async def test_replicas_started_during_an_outage_do_not_each_get_the_whole_budget(
    make_guarded: MakeGuarded, redis_store: Store
) -> None:
    """Three replicas (--limits-replicas unset, the default) start while the store is
    down, fail mode local: together they must not admit more than the budget."""
    redis_store.kill()
    pols = policies(prompt_tokens_per_day=300)
    replicas = [make_guarded(pols, f"r{i}") for i in range(3)]
    admitted = 0
    for replica in replicas:
        await replica.restore([], time.time())
        decision = await replica.reserve(ACME, Cost(300, 0), time.time())
        admitted += 300 if decision.ticket is not None else 0
    assert admitted <= 300


async def test_an_ended_request_is_no_longer_renewed(make_guarded: MakeGuarded) -> None:
    """The guard's settle or release (store reachable or not) stops the renewal of the
    request's holds: the store gives them back, or they expire by their TTL."""
    limiter = make_guarded(policies(concurrency=2), "r0", replicas=1)
    await limiter.restore([], time.time())
    assert await limiter.contribute() is True
    first = await limiter.reserve(ACME, Cost(0, 0), time.time())
    second = await limiter.reserve(ACME, Cost(0, 0), time.time())
    assert first.ticket is not None
    assert second.ticket is not None
    assert await limiter.renew() == 2
    await limiter.release(first.ticket, time.time())
    limiter.calls.breaker.count, limiter.calls.breaker.open_until = 3, time.monotonic() + 60
    await limiter.release(second.ticket, time.time())  # missed: kept to send again
    assert limiter.shared.book.live == {}
    assert await limiter.renew() == 0


async def test_a_store_back_from_an_old_snapshot_is_rebuilt(
    make_guarded: MakeGuarded, redis_store: Store
) -> None:
    """300 tokens a day: 100 billed, the store snapshotted (SAVE), 150 more billed, then it
    restarts from that snapshot, its generation marker whole but the 150 lost. The
    heartbeat sees a store that restarted, starts a new generation and contributes this
    replica's journal: the store charges the 250 again (the rebuild counted)."""
    limiter = make_guarded(policies(prompt_tokens_per_day=300), "r0", replicas=1)
    await limiter.restore([], time.time())
    assert await limiter.contribute() is True
    assert await limiter.beat(15) == 1

    async def spend(units: int) -> None:
        decision = await limiter.reserve(ACME, Cost(units, 0), time.time())
        assert decision.ticket is not None
        await limiter.settle(decision.ticket, Cost(units, 0), time.time())

    async def charged() -> int:
        (budget,) = limiter.shared.book.budgets(time.time())
        client = Redis.from_url(redis_store.url)
        try:
            return int(await client.hget(budget.key, "used") or 0)
        finally:
            await client.aclose()

    await spend(100)
    admin = Redis.from_url(redis_store.url)
    await admin.save()
    await admin.aclose()
    await spend(150)
    rebuilds = limiter.contribution.rebuilds
    redis_store.kill()
    redis_store.start()  # from the snapshot: 100 charged, the generation whole
    assert await charged() == 100
    for _ in range(3):  # the first call may find its pooled connection gone
        if await limiter.beat(15) is not None:
            break
    assert await charged() == 250
    assert limiter.contribution.rebuilds == rebuilds + 1


async def test_a_restarted_replica_keeps_the_count_it_read(
    make_guarded: MakeGuarded, redis_store: Store, tmp_path: Path
) -> None:
    """--limits-replicas unset: two replicas counted each other, then both restart (a
    cold start) on a store that restarted empty. Each recalls the count it read (kept
    beside its journal): the store's new generation is whole once both have contributed,
    and their tenants are admitted by the store at once, not refused (503, the count not
    known) while the generation waited a grace for replicas it could not name."""
    pols = policies(prompt_tokens_per_day=300)

    def replica(name: str) -> GuardedLimiter:
        return make_guarded(pols, name, kept=CountFile(tmp_path / name))

    first = [replica("r0"), replica("r1")]
    for each in first:
        each.shared.grace = 0.5
        await each.restore([], time.time())
    for each in first:  # each begins its stay in the registry
        assert await each.beat(1.0) is not None
    for _ in range(3):  # each stays a whole registry TTL (1 s here) and reads the count
        await asyncio.sleep(0.4)
        for each in first:
            assert await each.beat(1.0) == 2
    assert [each.heartbeat.counted for each in first] == [True, True]
    for each in first:
        await each.close()
    client = Redis.from_url(redis_store.url)
    await client.flushall()  # the store restarted empty
    await client.aclose()
    again = [replica("r0"), replica("r1")]  # the grace: 60 s
    for each in again:
        await each.restore([], time.time())
    await asyncio.gather(*[each.contribute() for each in again])
    decision = await again[0].reserve(ACME, Cost(10, 0), time.time())
    assert decision.refusal is None, decision.refusal
    assert not isinstance(decision.ticket, LocalTicket)  # by the store, not the fail mode
    assert again[0].problem() is None
    assert [each.mode.replicas for each in again] == [2, 2]


async def test_a_count_read_replaces_the_one_recalled(
    make_guarded: MakeGuarded, tmp_path: Path
) -> None:
    """A replica recalls the count it kept (3) and divides by it until it has stayed a
    registry TTL, then by the live count it reads (1), which it keeps in its place."""
    kept = CountFile(tmp_path / "count")
    kept.write(3)
    limiter = make_guarded(policies(prompt_tokens_per_day=300), "r0", kept=kept)
    limiter.shared.grace = 0.5
    await limiter.restore([], time.time())
    assert await limiter.beat(1.0) == 1
    assert (limiter.heartbeat.counted, limiter.mode.replicas) == (True, 3)
    for _ in range(3):  # it stays a whole registry TTL (1 s here)
        await asyncio.sleep(0.4)
        assert await limiter.beat(1.0) == 1
    assert (limiter.heartbeat.counted, limiter.mode.replicas) == (True, 1)
    assert CountFile(tmp_path / "count").read() == 1


class WatchedCountFile(CountFile):
    """A count file that notes the thread each write runs in."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.threads: list[threading.Thread] = []

    def write(self, count: int) -> None:
        self.threads.append(threading.current_thread())
        super().write(count)


async def test_the_count_is_kept_off_the_event_loop(
    make_guarded: MakeGuarded, tmp_path: Path
) -> None:
    """Keeping the count read (a file written and replaced) never runs on the event loop:
    each write is in a worker thread, and the count is kept."""
    kept = WatchedCountFile(tmp_path / "count")
    limiter = make_guarded(policies(prompt_tokens_per_day=300), "r0", kept=kept)
    await limiter.restore([], time.time())
    for _ in range(3):  # it stays a whole registry TTL (0.6 s here)
        assert await limiter.beat(0.6) == 1
        await asyncio.sleep(0.3)
    assert kept.threads
    assert threading.current_thread() not in kept.threads
    assert CountFile(tmp_path / "count").read() == 1
