"""The tokenizer pool: every thread warmed with its own copy, small bodies in their lane."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from proxy.tokenizers.hf import HFTokenizer, load_tokenizer
from proxy.tokenizers.pool import FairExecutor, TokenizerPool


def test_pool_warms_every_thread(minilm: HFTokenizer) -> None:
    """After warm(), each worker thread already has its own copy."""
    pool = TokenizerPool(3)
    pool.warm(minilm)
    seen: set[int] = set()
    lock = threading.Lock()
    barrier = threading.Barrier(3)

    def probe() -> None:
        copies = pool._local.__dict__.get("copies", {})
        with lock:
            seen.add(id(copies.get(minilm.key)))
        barrier.wait(5)

    for f in [pool.executor.submit(probe) for _ in range(3)]:
        f.result(10)
    pool.shutdown()
    assert len(seen) == 3
    assert id(None) not in seen


def test_small_bodies_never_queue_behind_large_ones(minilm_path: Path) -> None:
    """Regression: two large neighbours held both tokenizer threads and a small rerank
    waited past the accounting timeout (unaudited, billed inflated). Small bodies count
    in their own lane."""
    pool = TokenizerPool(2)
    tok = load_tokenizer(minilm_path)
    release = threading.Event()
    busy = [pool.lane(8 * 1024 * 1024).submit(release.wait, 30) for _ in range(2)]
    try:
        small = pool.lane(2_000).submit(
            lambda: pool.local_copy(tok).lengths(["Paris."], max_length=None)
        )
        assert small.result(timeout=5) == [4]
        assert not any(f.done() for f in busy)
    finally:
        release.set()
        pool.shutdown()


def test_tenants_take_turns_however_many_jobs_a_neighbour_queued() -> None:
    """Regression (issue #27, case 2): 20 of bob's large reranks queued in the small lane
    (one thread) and alice's count waited for all of them, past the accounting timeout.
    Now alice's job runs after the one running and at most one more of bob's."""
    lane = FairExecutor(1, "test-lane")
    started = threading.Event()
    gate = threading.Event()
    order: list[str] = []

    def job(name: str) -> None:
        started.set()
        gate.wait(10)
        order.append(name)

    try:
        bobs = [lane.submit_for("bob", job, f"bob-{i}") for i in range(20)]
        assert started.wait(5)  # bob-0 holds the thread
        alices = lane.submit_for("alice", job, "alice")
        assert lane.queued() == {"bob": 19, "alice": 1}
        gate.set()
        alices.result(timeout=10)
        for future in bobs:
            future.result(timeout=10)
    finally:
        lane.shutdown()
    assert order.index("alice") == 2  # bob-0 was running; bob's turn came before hers
    assert [n for n in order if n != "alice"] == [f"bob-{i}" for i in range(20)]


def test_a_cancelled_job_never_runs_and_shutdown_cancels_the_queue() -> None:
    lane = FairExecutor(1, "test-lane")
    gate = threading.Event()
    ran: list[int] = []
    holder = lane.submit(gate.wait, 10)
    waiting = [lane.submit_for("t", ran.append, i) for i in range(3)]
    assert waiting[0].cancel()
    gate.set()
    holder.result(timeout=5)
    waiting[2].result(timeout=5)
    assert ran == [1, 2]
    stuck = threading.Event()
    lane.submit(stuck.wait, 10)
    queued = lane.submit(ran.append, 9)
    stuck.set()
    lane.shutdown(wait=True, cancel_futures=True)
    assert queued.cancelled() or ran[-1] == 9
    with pytest.raises(RuntimeError):
        lane.submit(ran.append, 10)


def test_an_exception_reaches_the_caller_and_the_worker_lives_on() -> None:
    lane = FairExecutor(1, "test-lane")
    try:
        with pytest.raises(ZeroDivisionError):
            lane.submit(lambda: 1 // 0).result(timeout=5)
        assert lane.submit(lambda: 42).result(timeout=5) == 42
    finally:
        lane.shutdown()
