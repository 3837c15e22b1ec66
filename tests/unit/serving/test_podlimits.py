"""The pod's limits on the supervisor's side: the host rebuilt from every journal shard
(a part each), a dead worker's shard read again exactly once, and on the worker's side a
host that cannot be reached is a start-up error; with a store, every worker a replica."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import settings as examples
from hypothesis import strategies as st

from proxy.ledger.journal import Journal
from proxy.ledger.shards import shard_path
from proxy.limits.history import History
from proxy.limits.limiter import Cost, Who
from proxy.limitstore.hosted import HostedLimiter
from proxy.serving.pod import Place
from proxy.serving.podlimits import hosted_context, hosted_limits, replica_settings
from proxy.serving.startup import StartupError
from proxy.settings import Settings
from tests.support.records import make_record

ACME = Who("acme", "minilm", None)
LIMITS = {"tenants": {"acme": {"prompt_tokens_per_month": 100, "concurrency": 5}}}


@pytest.fixture
def runtime() -> AsyncIterator[Path]:
    """A short directory, as the supervisor's (a Unix socket's path fits 108 bytes)."""
    directory = Path(tempfile.mkdtemp(prefix="pod-"))
    yield directory
    shutil.rmtree(directory)


def settings_in(runtime: Path, limits_text: str | None = None, **options: object) -> Settings:
    limits = runtime / "limits.yaml"
    limits.write_text(yaml.safe_dump(LIMITS) if limits_text is None else limits_text)
    journal = str(runtime / "usage.sqlite")
    defaults = {"upstream": "http://127.0.0.1:1", "journal": journal, "limits": str(limits)}
    return Settings(**{**defaults, **options})


async def journal_into(path: Path, *billed: int) -> None:
    """A worker's shard holding one record per ``billed`` (acme's, this month)."""
    journal = Journal(path)
    await journal.open()
    for i, tokens in enumerate(billed):
        await journal.append(make_record(i, billed=tokens))
    await journal.close()


async def remaining(limiter: HostedLimiter) -> int:
    (month,) = [s for s in await limiter.standing("acme", time.time()) if s.limit.budget]
    return month.standing.remaining


async def test_no_host_without_limits_or_with_a_store(runtime: Path) -> None:
    """The supervisor hosts nothing without a limits file, nor with a store (each worker
    is then a replica of the store)."""
    plain = Settings(upstream="http://127.0.0.1:1", journal=str(runtime / "usage.sqlite"))
    async with hosted_limits(plain, runtime) as pod:
        assert pod is None
    stored = settings_in(runtime, limits_store="redis://127.0.0.1:1/0")
    async with hosted_limits(stored, runtime) as pod:
        assert pod is None
    assert not (runtime / "limiter.sock").exists()


async def test_the_host_starts_from_every_shard_a_part_each(runtime: Path) -> None:
    """A restart keeps the month: the host reads worker 0's journal and worker 1's shard
    (and a shard of a pod that had more workers), each as its own part, before any worker
    connects; what any worker sees left is the budget less all of them."""
    settings = settings_in(runtime)
    journal = Path(settings.journal)
    await journal_into(journal, 10, 5)
    await journal_into(shard_path(journal, 1), 20)
    await journal_into(shard_path(journal, 3), 1)
    async with hosted_limits(settings, runtime) as pod:
        assert pod is not None
        assert sorted(pod.host.limiter.parts) == [0, 1, 3]
        worker = await HostedLimiter.connect(
            Place(1, 2, runtime).limiter_socket, pod.host.limiter.policies, 1
        )
        assert await remaining(worker) == 100 - 10 - 5 - 20 - 1
        await worker.close()


async def test_a_dead_workers_shard_is_read_again_and_counted_once(runtime: Path) -> None:
    """Worker 1 reserves 30 and 40, settles the first at 25 (its record committed too),
    commits the second's record at 35 and dies before settling it: its held units keep
    the budget until the supervisor reads its shard again; then the pod has exactly the
    shard's 60 billed, neither the reservation nor the record twice."""
    settings = settings_in(runtime)
    journal = Path(settings.journal)
    async with hosted_limits(settings, runtime) as pod:
        assert pod is not None
        policies = pod.host.limiter.policies
        path = Place(1, 2, runtime).limiter_socket
        dying, other = [await HostedLimiter.connect(path, policies, k) for k in (1, 0)]
        now = time.time()
        first = await dying.reserve(ACME, Cost(30, 0), now)
        second = await dying.reserve(ACME, Cost(40, 0), now)
        assert first.ticket is not None
        assert second.ticket is not None
        await dying.settle(first.ticket, Cost(25, 0), now)
        await journal_into(shard_path(journal, 1), 25, 35)
        await dying.close()  # a goodbye with a ticket open: as a death, its units held
        assert await remaining(other) == 100 - 25 - 40
        assert await pod.worker_exited(1) >= 1  # its sums: one a quarter hour
        assert await remaining(other) == 100 - 60
        assert await pod.worker_exited(1) >= 1  # read again: the same part, not added
        assert await remaining(other) == 100 - 60
        await other.close()


async def test_a_dead_workers_shard_is_read_off_the_supervisors_loop(
    runtime: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review finding 9: the re-read's history (which grows with the month's usage) is
    built in another thread, never on the loop that answers every reservation of the
    pod; only the swap of the part runs there. And worker_exited waits for the host to
    have seen the dead worker's connection close: a worker killed the instant before
    (its socket aborted, the host not yet told) has its held units dropped all the same."""
    settings = settings_in(runtime)
    threads: set[int] = set()
    note = History.note

    def noted(self: History, who: Who, cost: Cost, at: float) -> None:
        threads.add(threading.get_ident())
        note(self, who, cost, at)

    async with hosted_limits(settings, runtime) as pod:
        assert pod is not None
        path, policies = pod.host.path, pod.host.limiter.policies
        dying, other = [await HostedLimiter.connect(path, policies, k) for k in (1, 0)]
        held = await dying.reserve(ACME, Cost(40, 0), time.time())
        assert held.ticket is not None
        await journal_into(shard_path(Path(settings.journal), 1), 25)
        monkeypatch.setattr(History, "note", noted)
        assert dying._writer is not None
        dying._writer.transport.abort()  # SIGKILL: no bye
        assert await pod.worker_exited(1) == 1
        assert threads
        assert threading.get_ident() not in threads
        assert await remaining(other) == 100 - 25
        await other.close()


async def test_without_a_journal_a_dead_workers_units_stay_held(runtime: Path) -> None:
    """With --journal off there is no shard to read: what a dead worker held stays held
    (never an overshoot)."""
    settings = settings_in(runtime, journal="off")
    async with hosted_limits(settings, runtime) as pod:
        assert pod is not None
        path, policies = pod.host.path, pod.host.limiter.policies
        dying, other = [await HostedLimiter.connect(path, policies, k) for k in (1, 0)]
        assert (await dying.reserve(ACME, Cost(30, 0), time.time())).ticket is not None
        await dying.close()
        assert await pod.worker_exited(1) == 0
        assert await remaining(other) == 70
        await other.close()


async def test_a_bad_limits_file_stops_the_pods_start_in_one_line(runtime: Path) -> None:
    """The supervisor reads the limits file before any worker: a broken one is the same
    one-line start-up error a single process gives."""
    settings = settings_in(runtime, "tenants: [not, a, mapping]\n")
    with pytest.raises(StartupError, match="cannot read --limits"):
        async with hosted_limits(settings, runtime):
            pass


async def test_a_worker_without_its_host_does_not_start(runtime: Path) -> None:
    """A worker whose host cannot be reached at start fails its start-up, naming the
    socket (the supervisor starts the host before any worker)."""
    settings = settings_in(runtime)
    async with hosted_limits(settings, runtime) as pod:
        assert pod is not None
        policies = pod.host.limiter.policies
    limiter = HostedLimiter(policies, runtime / "limiter.sock", 0)
    context = hosted_context(limiter.lifetime(journaled=True))(None)  # type: ignore[arg-type]
    with pytest.raises(StartupError, match=r"limiter\.sock"):
        await anext(context)


def test_with_a_store_every_worker_is_a_replica(runtime: Path) -> None:
    """With a store each worker is a replica named by its index (stable across its
    restarts) and --limits-replicas, which counts pods, counts their workers."""
    settings = settings_in(runtime, instance="pod-a", limits_replicas=3)
    one = replica_settings(settings, Place(1, 2, runtime))
    assert (one.instance, one.limits_replicas) == ("pod-a#1", 6)
    assert replica_settings(settings, Place(0, 2, runtime)).instance == "pod-a#0"
    assert settings.instance == "pod-a"  # the worker's own records keep the pod's name
    unset = replica_settings(settings_in(runtime), Place(0, 4, runtime))
    assert unset.limits_replicas == 0  # 0: the live count, read from the store


async def _death(
    runtime: Path, mine: list[int], settled: list[int], unsettled: list[int], lost: list[int]
) -> tuple[int, int]:
    """Worker 0 bills ``mine``; worker 1 bills ``settled`` (journaled and settled),
    journals ``unsettled`` without settling them, holds ``lost`` (never journaled), and
    dies. What is left of a 10,000-token month once its shard is read again, and what
    the shards billed."""
    limits = yaml.safe_dump({"tenants": {"acme": {"prompt_tokens_per_month": 10_000}}})
    settings = settings_in(runtime, limits)
    journal = Path(settings.journal)
    async with hosted_limits(settings, runtime) as pod:
        assert pod is not None
        path, policies = pod.host.path, pod.host.limiter.policies
        workers = [await HostedLimiter.connect(path, policies, k) for k in (0, 1)]
        now = time.time()
        for k, bills, settles in ((0, mine, True), (1, settled, True), (1, unsettled, False)):
            for billed in bills:
                decision = await workers[k].reserve(ACME, Cost(billed + 1, 0), now)
                assert decision.ticket is not None
                if settles:
                    await workers[k].settle(decision.ticket, Cost(billed, 0), now)
        for cost in lost:
            assert (await workers[1].reserve(ACME, Cost(cost, 0), now)).ticket is not None
        await journal_into(journal, *mine)
        await journal_into(shard_path(journal, 1), *settled, *unsettled)
        await workers[1].close()  # tickets open: its units held, as a death leaves them
        await pod.worker_exited(1)
        left = await remaining(workers[0])
        await workers[0].close()
    return left, sum(mine) + sum(settled) + sum(unsettled)


@examples(max_examples=20, deadline=None)
@given(
    mine=st.lists(st.integers(0, 300), max_size=4),
    settled=st.lists(st.integers(0, 300), max_size=4),
    unsettled=st.lists(st.integers(0, 300), max_size=4),
    lost=st.lists(st.integers(1, 300), max_size=4),
)
def test_a_dead_worker_is_billed_exactly_what_its_shard_holds(
    mine: list[int], settled: list[int], unsettled: list[int], lost: list[int]
) -> None:
    """Whatever a dead worker had settled, journaled without settling, or held without
    a record: once its shard is read again the pod's month is the budget less exactly
    what every shard billed (nothing twice, nothing held, nothing missed)."""
    runtime = Path(tempfile.mkdtemp(prefix="prop-"))
    try:
        left, billed = asyncio.run(_death(runtime, mine, settled, unsettled, lost))
    finally:
        shutil.rmtree(runtime)
    assert left == 10_000 - billed
