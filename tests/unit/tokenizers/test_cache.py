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
    """The cache never holds more than its size, and keeps the newest entries."""
    cache = CountCache(4)
    twin = minilm.copy()
    twin.cache = cache
    texts = [f"text {i}" for i in range(10)]
    for text in texts:
        twin.lengths([text], max_length=None)
        assert len(cache) <= 4
    assert len(cache) == 4
    assert set(cache.held()) == set(texts[-4:])


def test_an_entry_in_use_outlives_many_new_ones(minilm: HFTokenizer) -> None:
    """Least recently used goes first: a text hit at least once per half-cache of new
    entries is never evicted, however many pass; one not used for a whole cache is."""
    cache = CountCache(10)
    twin = minilm.copy()
    twin.cache = cache
    twin.lengths(["kept", "dropped"], max_length=None)
    for i in range(100):
        twin.lengths([f"new {i}"], max_length=None)
        if i % 5 == 4:
            assert cache.cached(twin, ["kept"], None) == minilm.lengths(["kept"], max_length=None)
    assert "kept" in set(cache.held())
    assert cache.cached(twin, ["dropped"], None) is None
    assert len(cache) <= 10


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
    assert cache.held_bytes == sum(sys.getsizeof(k) for k in cache.held() if isinstance(k, str))
    assert any(isinstance(k, bytes) for k in cache.held())  # the long text: a digest
    assert cache.cached(twin, [long], None) == minilm.lengths([long], max_length=None)
    assert cache.cached(twin, [short[0]], None) is None  # evicted first (least recent)
