"""The tokenizer adapter, its per-thread copies, warm-up and the shared count cache."""

from __future__ import annotations

import threading
from pathlib import Path

from proxy.tokenizer import CountCache, HFTokenizer, TokenizerPool, load_tokenizer

TEXTS = ["Paris is the capital of France.", "", "안녕하세요", "x " * 300]


def test_cache_returns_what_the_tokenizer_counts(minilm_path: Path) -> None:
    """Cached lengths equal uncached ones, per max_length; repeats are hits."""
    plain = load_tokenizer(minilm_path)
    cached = load_tokenizer(minilm_path)
    cached.cache = CountCache(100)
    for limit in (None, 16, 257):
        assert cached.lengths(TEXTS, max_length=limit) == plain.lengths(TEXTS, max_length=limit)
    assert cached.cache.misses == 12
    cached.lengths(TEXTS, max_length=16)
    assert cached.cache.hits == 4


def test_cache_is_bounded(minilm: HFTokenizer) -> None:
    """The LRU never holds more than its size."""
    cache = CountCache(3)
    twin = minilm.copy()
    twin.cache = cache
    twin.lengths([f"text {i}" for i in range(10)], max_length=None)
    assert len(cache._data) == 3


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
