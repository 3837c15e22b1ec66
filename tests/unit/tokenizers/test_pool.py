"""The tokenizer pool: every thread warmed with its own copy, small bodies in their lane."""

from __future__ import annotations

import threading
from pathlib import Path

from proxy.tokenizers.hf import HFTokenizer, load_tokenizer
from proxy.tokenizers.pool import TokenizerPool


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
