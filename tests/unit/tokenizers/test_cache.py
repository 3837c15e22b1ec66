"""The count cache: what the tokenizer counts, exactly for short texts, within bounds."""

from __future__ import annotations

from pathlib import Path

from proxy.tokenizers.cache import CountCache
from proxy.tokenizers.hf import HFTokenizer, load_tokenizer

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


def test_cache_holds_short_texts_exactly_and_bounds_their_bytes(minilm: HFTokenizer) -> None:
    """Short texts are their own keys (held in the cache, bounded in bytes); long ones
    are held as digests; either way counts equal the tokenizer's."""
    import sys

    from proxy.tokenizers.cache import EXACT_KEY_CHARS

    cache = CountCache(1000, held_bytes=3000)
    twin = minilm.copy()
    twin.cache = cache
    short = [f"document number {i} " * 5 for i in range(40)]
    long = "word " * EXACT_KEY_CHARS
    assert twin.lengths([*short, long], max_length=None) == minilm.lengths(
        [*short, long], max_length=None
    )
    assert 0 < cache.held_bytes <= 3000
    assert cache.held_bytes == sum(
        sys.getsizeof(k[2]) for k in cache._data if isinstance(k[2], str)
    )
    assert any(isinstance(k[2], bytes) for k in cache._data)  # the long text: a digest
    assert cache.cached(twin, [long], None) == minilm.lengths([long], max_length=None)
    assert cache.cached(twin, [short[0]], None) is None  # evicted first (least recent)
