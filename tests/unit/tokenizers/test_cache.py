"""The count cache: what the tokenizer counts, exactly for short texts, within bounds."""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

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


@pytest.mark.parametrize("size", [1, 3, 4])
def test_cache_is_bounded(minilm: HFTokenizer, size: int) -> None:
    """The cache never holds more than its size, and keeps the newest entries."""
    cache = CountCache(size)
    twin = minilm.copy()
    twin.cache = cache
    texts = [f"text {i}" for i in range(10)]
    for text in texts:
        twin.lengths([text], max_length=None)
        assert len(cache) <= size
    assert texts[-1] in set(cache.held())
    if size % 2 == 0:  # two full generations
        assert set(cache.held()) == set(texts[-size:])


def test_cache_bytes_are_bounded_whatever_the_entry(minilm: HFTokenizer) -> None:
    """Texts larger than half the byte bound each still fit under the whole of it."""
    text_bytes = sys.getsizeof("x" * 1000)
    cache = CountCache(100, held_bytes=text_bytes + text_bytes // 2)
    twin = minilm.copy()
    twin.cache = cache
    for i in range(5):
        twin.lengths([str(i) * 1000], max_length=None)
        assert 0 < cache.held_bytes <= text_bytes + text_bytes // 2


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


class _Counting:
    """A tokenizer whose count of a text is known in advance (scope-dependent, so an
    entry read under the wrong tokenizer, tenant or limit would show)."""

    def __init__(self, key: int, tenant: str) -> None:
        self.cache_key = (key, tenant)

    def encode_lengths(self, texts: Sequence[str], *, max_length: int | None) -> list[int]:
        return [_truth(self, t, max_length) for t in texts]


def _truth(tok: _Counting, text: str, max_length: int | None) -> int:
    return len(text) * 7 + tok.cache_key[0] * 3 + len(tok.cache_key[1]) + (max_length or 0)


_TOKENIZERS = [_Counting(0, ""), _Counting(0, "bob"), _Counting(1, "")]


@given(
    size=st.integers(1, 12),
    steps=st.lists(
        st.tuples(
            st.sampled_from(_TOKENIZERS),
            st.sampled_from([None, 5]),
            st.lists(st.sampled_from(["a", "bb", "ccc", "dddd", "x" * 3000, "é"]), max_size=4),
            st.booleans(),
        ),
        max_size=40,
    ),
)
def test_every_count_is_the_tokenizers_own_whatever_the_order(
    size: int, steps: list[tuple[_Counting, int | None, list[str], bool]]
) -> None:
    """Any interleaving of lookups and counts, across tokenizers, tenants and limits:
    every count returned is what that tokenizer counts under that limit, and the cache
    stays within its entries and bytes."""
    cache = CountCache(size, held_bytes=400)
    for tok, limit, texts, counting in steps:
        truth = [_truth(tok, t, limit) for t in texts]
        if counting:
            assert cache.lengths(tok, texts, limit) == truth
        else:
            assert cache.cached(tok, texts, limit) in (None, truth)
        assert len(cache) <= size
        assert cache.held_bytes <= 400


def test_a_text_twice_in_the_old_generation_is_found_both_times(minilm: HFTokenizer) -> None:
    """A request naming one document twice, both only in the old generation: the first
    moves it to the young one, and the second finds it there (review: KeyError, so every
    such request went to the tokenizer pool)."""
    cache = CountCache(4)
    twin = minilm.copy()
    twin.cache = cache
    for text in ("a", "b", "c"):  # the young generation holds two: a and b become old
        twin.lengths([text], max_length=None)
    expected = minilm.lengths(["a", "a"], max_length=None)
    assert cache.cached(twin, ["a", "a"], None) == expected
    assert len(cache) == 3


def test_held_bytes_never_undercount_what_the_keys_take() -> None:
    """A non-ASCII str grows when the tokenizer reads it (PyO3 keeps a UTF-8 copy in the
    object), so equal texts can differ in size: the byte count covers the keys as they
    are, whichever equal str moved an entry between generations (review: the count
    drifted below what was held, even below 0)."""
    tok = _Utf8Reading()
    cache = CountCache(4)  # two entries a generation
    text = "é" * 500
    cache.lengths(tok, [_fresh(text)], None)
    cache.lengths(tok, ["p"], None)
    cache.lengths(tok, ["r"], None)  # the first text is in the old generation
    cache.cached(tok, [_fresh(text)], None)  # moved to the young one as a small str
    cache.lengths(tok, ["s"], None)  # that generation is the old one now
    read = _fresh(text)
    tok.encode_lengths([read], max_length=7)  # read by the tokenizer before: large
    cache.lengths(tok, [read], None)  # found in the old generation, moved with it
    held = [k for k in cache.held() if isinstance(k, str)]
    assert sum(sys.getsizeof(k) for k in held) <= cache.held_bytes


_AS_UTF8 = ctypes.pythonapi.PyUnicode_AsUTF8AndSize
_AS_UTF8.restype, _AS_UTF8.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_void_p]


class _Utf8Reading:
    """Counts as the tokenizers library reads a str: through its UTF-8 form."""

    cache_key = (0, "")

    def encode_lengths(self, texts: Sequence[str], *, max_length: int | None) -> list[int]:
        for text in texts:
            _AS_UTF8(text, None)
        return [len(text) for text in texts]


def _fresh(text: str) -> str:
    """An equal str that no one has read yet, as each request parses anew."""
    return text.encode().decode()
