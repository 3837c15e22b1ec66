"""The pod's limiter host: workers on two connections admit against one budget exactly,
a dead worker's tickets are resolved (gates at once, rates kept, budgets once its shard is
read again), the protocol is versioned and typed."""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.limits.history import History
from proxy.limits.limiter import Cost, Who
from proxy.limits.meters import BudgetMeter, Gate, RateMeter
from proxy.limits.policy import Policies
from proxy.limitstore import host as host_module
from proxy.limitstore.host import LimiterHost
from proxy.limitstore.hosted import HostedLimiter, HostError
from proxy.limitstore.hostwire import VERSION, Hello, Replace, Reserve
from proxy.limitstore.memory import InProcessLimiter

ACME = Who("acme", "m", "k1")
# A worker process: connects as part argv[2], says "ready", waits for "go", then makes
# 100 simultaneous reservations and prints how many were admitted.
WORKER = """
import asyncio, sys, time
from pathlib import Path
from proxy.limits.limiter import Cost, Who
from proxy.limits.policy import Policies
from proxy.limitstore.hosted import HostedLimiter

async def main() -> None:
    policies = Policies.model_validate({"tenants": {"acme": {"requests_per_minute": 100}}})
    worker = await HostedLimiter.connect(Path(sys.argv[1]), policies, int(sys.argv[2]))
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    now = time.time()
    who = Who("acme", "m", "k1")
    decisions = await asyncio.gather(*(worker.reserve(who, Cost(3), now) for _ in range(100)))
    print(sum(d.ticket is not None for d in decisions), flush=True)
    await worker.close()

asyncio.run(main())
"""
Connect = Callable[[int], Awaitable[HostedLimiter]]


def policies(**tenant: object) -> Policies:
    return Policies.model_validate({"tenants": {"acme": tenant}})


@pytest.fixture
def socket_path() -> AsyncIterator[Path]:
    """A short directory: a Unix socket's path must fit in 108 bytes."""
    directory = Path(tempfile.mkdtemp(prefix="host-"))
    yield directory / "limiter.sock"
    shutil.rmtree(directory)


Serve = Callable[[Policies], Awaitable[tuple[LimiterHost, Connect]]]


@pytest.fixture
async def serve(socket_path: Path) -> AsyncIterator[Serve]:
    """A host on the test's socket and its workers' connections, all closed at the end."""
    hosts: list[LimiterHost] = []
    workers: list[HostedLimiter] = []

    async def start(policy: Policies) -> tuple[LimiterHost, Connect]:
        host = LimiterHost(InProcessLimiter(policy), socket_path)
        await host.start()
        hosts.append(host)

        async def connect(part: int) -> HostedLimiter:
            worker = await HostedLimiter.connect(socket_path, policy, part)
            workers.append(worker)
            return worker

        return host, connect

    yield start
    for worker in workers:
        await worker.close()
    for host in hosts:
        await host.close()


def meters(host: LimiterHost, kind: type) -> list:
    return [m for m in host.limiter.meters.values() if isinstance(m, kind)]


async def test_a_burst_over_two_workers_admits_exactly_the_limit(serve: Serve) -> None:
    """Two workers, 100 simultaneous reservations each, against 100 requests a minute:
    exactly 100 admitted, whichever worker they came through (the bench's burst)."""
    _, connect = await serve(policies(requests_per_minute=100))
    workers = [await connect(0), await connect(1)]
    now = time.time()
    decisions = await asyncio.gather(
        *(w.reserve(ACME, Cost(3, 0), now) for w in workers for _ in range(100))
    )
    admitted = [d for d in decisions if d.ticket is not None]
    assert len(admitted) == 100
    assert {d.refusal.limit for d in decisions if d.refusal} == {"requests_per_minute"}


async def test_a_burst_from_two_worker_processes_admits_exactly_the_limit(
    serve: Serve, socket_path: Path
) -> None:
    """The same burst from two real processes, released together: 100 admitted in all,
    however the host interleaves their lines."""
    await serve(policies(requests_per_minute=100))
    workers = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            WORKER,
            str(socket_path),
            str(part),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        for part in (0, 1)
    ]
    for worker in workers:
        assert worker.stdout is not None
        assert await asyncio.wait_for(worker.stdout.readline(), 60) == b"ready\n"
    for worker in workers:
        assert worker.stdin is not None
        worker.stdin.write(b"go\n")
    admitted = []
    for worker in workers:
        out, _ = await asyncio.wait_for(worker.communicate(), 60)
        admitted.append(int(out))
        assert worker.returncode == 0
    assert sum(admitted) == 100


async def test_a_budget_is_spendable_to_the_end_through_either_worker(serve: Serve) -> None:
    """Worker 0 spends most of a budget, worker 1 the rest, and then neither has more:
    the remainder is the pod's, not a worker's share; settlements count what was billed."""
    host, connect = await serve(policies(prompt_tokens_per_month=100))
    first, second = await connect(0), await connect(1)
    now = time.time()
    for _ in range(7):
        decision = await first.reserve(ACME, Cost(10, 0), now)
        assert decision.ticket is not None
        await first.settle(decision.ticket, Cost(10, 0), now)
    spent = await second.reserve(ACME, Cost(30, 0), now)
    assert spent.ticket is not None
    assert spent.tokens is not None
    assert spent.tokens.remaining == 0
    await second.settle(spent.ticket, Cost(30, 0), now)
    for worker in (first, second):
        refused = await worker.reserve(ACME, Cost(1, 0), now)
        assert refused.refusal is not None
        assert refused.refusal.budget
    assert host.limiter.history.whos() == []  # each worker's part holds its own
    assert sorted(host.limiter.parts) == [0, 1]


async def test_a_dead_workers_tickets_are_resolved(serve: Serve) -> None:
    """A worker dies with a request in flight: its concurrency slot comes back at once,
    its rate stays taken, its budget units stay held until its shard has been read again,
    which then counts what it billed (the record it committed), once."""
    policy = policies(concurrency=1, requests_per_minute=5, prompt_tokens_per_month=100)
    host, connect = await serve(policy)
    dying, other = await connect(1), await connect(0)
    now = time.time()
    held = await dying.reserve(ACME, Cost(40, 0), now)
    assert held.ticket is not None
    assert (await other.reserve(ACME, Cost(1, 0), now)).refusal.limit == "concurrency"
    dying._writer.transport.abort()  # SIGKILL: no bye, no settle
    await host.hung_up(1)  # the host saw its connection close: its tickets all held
    assert len(host.held[1]) == 1
    assert [g.held for g in meters(host, Gate)] == [0]
    budget = meters(host, BudgetMeter)[0]
    assert budget.reserved == 40
    rate = meters(host, RateMeter)[0]
    assert rate.standing(now)[1] == 4  # one of five taken, kept

    shard = History()  # what the dead worker had journaled
    shard.note(ACME, Cost(25, 0), now)
    host.reread(1, shard)
    assert budget.reserved == 0
    admitted = await other.reserve(ACME, Cost(1, 0), now)
    assert admitted.tokens is not None
    assert admitted.tokens.remaining == 100 - 25 - 1
    host.reread(1, shard)  # read again: replaced, not added
    assert budget.standing(now)[1] == 100 - 25 - 1


async def test_new_policies_apply_once_for_the_pod(serve: Serve) -> None:
    """A worker that reloaded the limits file sends the policies: the host uses them from
    the next reservation on, whichever worker asks; the same policies again change
    nothing (every worker sends the file it reloaded)."""
    host, connect = await serve(policies(requests_per_minute=1))
    first, second = await connect(0), await connect(1)
    now = time.time()
    assert (await first.reserve(ACME, Cost(), now)).ticket is not None
    assert (await second.reserve(ACME, Cost(), now)).ticket is None
    wider = policies(requests_per_minute=3)
    first.replace(wider)
    second.replace(wider)
    assert (await second.reserve(ACME, Cost(), now)).ticket is not None
    assert host.limiter.policies.model_dump() == wider.model_dump()
    assert first.wants_tokens("acme") is False


async def test_a_worker_started_on_an_older_file_rolls_nothing_back(serve: Serve) -> None:
    """Review finding 7: worker 0 reloaded a new file (3 a minute) after worker 1 had
    read the old one (1 a minute); worker 1 connecting then keeps the host on the new
    file (logged), while a worker that brings a file the host never applied (5 a
    minute: changed before any reload said so) is followed."""
    older, newer, newest = (policies(requests_per_minute=n) for n in (1, 3, 5))
    host, connect = await serve(older)
    first = await connect(0)
    first.replace(newer)
    assert (await first.reserve(ACME, Cost(), time.time())).ticket is not None  # in order
    assert host.limiter.policies.model_dump() == newer.model_dump()
    late = HostedLimiter(older, host.path, 1)
    await late.open()
    assert (await late.reserve(ACME, Cost(), time.time())).ticket is not None
    assert host.limiter.policies.model_dump() == newer.model_dump()
    fresh = HostedLimiter(newest, host.path, 2)
    await fresh.open()
    assert (await fresh.reserve(ACME, Cost(), time.time())).ticket is not None
    assert host.limiter.policies.model_dump() == newest.model_dump()
    await late.close()
    await fresh.close()


async def test_a_limits_file_of_2000_tenants_reaches_the_host(serve: Serve) -> None:
    """Review finding 1: the policies of 2,000 tenants (over a megabyte as one line, far
    over asyncio's 64 KiB default) travel to the host; both workers admit and refuse
    through it, none is cut off."""
    many = Policies.model_validate(
        {
            "tenants": {
                f"tenant-{k:04}": {"prompt_tokens_per_month": 1000 + k, "requests_per_minute": 2}
                for k in range(2000)
            }
        }
    )
    assert len(Replace(policies=many).line()) > 1024 * 1024
    host, _ = await serve(policies(requests_per_minute=1))
    workers = [HostedLimiter(many, host.path, part) for part in (0, 1)]
    for worker in workers:
        await worker.open()
    who = Who("tenant-1999", "m", "k1")
    now = time.time()
    decisions = [await w.reserve(who, Cost(1, 0), now) for w in (*workers, *workers)]
    assert [d.ticket is not None for d in decisions] == [True, True, False, False]
    assert {d.refusal.limit for d in decisions if d.refusal} == {"requests_per_minute"}
    assert len(host.limiter.policies.tenants) == 2000
    for worker in workers:
        assert worker.problem() is None
        await worker.close()


async def test_a_line_over_the_limit_is_refused_with_the_reason(
    serve: Serve, socket_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A line longer than the host reads (its limit lowered here to 4 KiB) is refused
    with an error line naming the limit and the connection closed, as any line that is
    not a message: never an unhandled error in the host."""
    monkeypatch.setattr(host_module, "LINE_LIMIT", 4096)
    await serve(policies(requests_per_minute=1))
    reader, writer = await asyncio.open_unix_connection(str(socket_path))
    writer.write(Hello(version=VERSION, part=0).line())
    assert b"welcome" in await reader.readline()
    writer.write(b'{"op":"bye","pad":"' + b"x" * 8192 + b'"}\n')
    answer = await reader.readline()
    assert b'"op":"error"' in answer
    assert b"over 4096 bytes" in answer
    assert await reader.readline() == b""
    writer.close()


async def test_another_protocol_version_is_refused_in_one_line(
    serve: Serve, socket_path: Path
) -> None:
    """A worker of another release (another protocol version) is refused at its hello,
    with the reason, and the connection closed: never half understood."""
    await serve(policies(requests_per_minute=1))
    reader, writer = await asyncio.open_unix_connection(str(socket_path))
    writer.write(Hello(version=VERSION + 1, part=0).line())
    answer = await reader.readline()
    assert b'"op":"error"' in answer
    assert f"protocol version {VERSION + 1}".encode() in answer
    assert await reader.readline() == b""  # closed
    writer.close()


@pytest.mark.parametrize(
    "line",
    [
        b"not json\n",
        b'{"op":"reserve","n":1,"who":{"tenant":"acme"},"cost":{},"now":"soon"}\n',
        b'{"op":"launch","n":1}\n',
        b'{"op":"release","ticket":1,"now":1.0,"extra":1}\n',
    ],
)
async def test_a_line_that_is_not_a_message_closes_the_connection(
    serve: Serve, socket_path: Path, line: bytes
) -> None:
    """Typed at the boundary: a malformed line, a wrong type, an unknown operation or an
    unknown field is refused with the reason and the connection closed, its tickets
    resolved as a dead worker's."""
    host, _ = await serve(policies(concurrency=1))
    reader, writer = await asyncio.open_unix_connection(str(socket_path))
    writer.write(Hello(version=VERSION, part=0).line())
    assert b"welcome" in await reader.readline()
    writer.write(Reserve(n=1, who=ACME, cost=Cost(), now=time.time()).line())
    assert b'"ticket":1' in await reader.readline()
    writer.write(line)
    assert b'"op":"error"' in await reader.readline()
    assert await reader.readline() == b""
    assert [g.held for g in meters(host, Gate)] == [0]
    writer.close()


async def test_a_worker_without_a_host_is_told_why(socket_path: Path) -> None:
    """No host listening: connecting fails with the path, as one clear error."""
    with pytest.raises(HostError, match="cannot reach the limiter host"):
        await HostedLimiter.connect(socket_path, policies(concurrency=1), 0)


async def _burst(path: Path, amount: int, costs: list[list[int]]) -> tuple[int, list[int]]:
    """Each list of ``costs`` reserved at once on its own connection: the tokens admitted
    in all, and the costs refused."""
    policy = policies(prompt_tokens_per_month=amount)
    host = LimiterHost(InProcessLimiter(policy), path)
    await host.start()
    workers = [await HostedLimiter.connect(path, policy, k) for k in range(len(costs))]
    now = time.time()
    calls = [(w, c) for w, mine in zip(workers, costs, strict=True) for c in mine]
    decisions = await asyncio.gather(*(w.reserve(ACME, Cost(c, 0), now) for w, c in calls))
    for worker in workers:
        await worker.close()
    await host.close()
    admitted = sum(c for (_, c), d in zip(calls, decisions, strict=True) if d.ticket)
    return admitted, [c for (_, c), d in zip(calls, decisions, strict=True) if not d.ticket]


@settings(max_examples=25, deadline=None)
@given(
    amount=st.integers(1, 200),
    costs=st.lists(st.lists(st.integers(1, 60), max_size=12), min_size=2, max_size=2),
)
def test_two_workers_never_overshoot_nor_strand_a_budget(
    amount: int, costs: list[list[int]]
) -> None:
    """However the host interleaves two workers' simultaneous reservations: what it admits
    never exceeds the budget, and each refused one would not have fit in what is left."""
    directory = Path(tempfile.mkdtemp(prefix="prop-"))
    try:
        admitted, refused = asyncio.run(_burst(directory / "limiter.sock", amount, costs))
    finally:
        shutil.rmtree(directory)
    assert admitted <= amount
    assert all(cost > amount - admitted for cost in refused)
