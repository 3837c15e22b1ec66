"""The tokenizer adapter, its per-thread copies, warm-up and the shared count cache."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


TEXT_ALPHABET = st.sampled_from(
    ["a", "b", "é", "字", "한", "🙂", " ", "  ", "\n", ".", ",", "-", "word", "THE", "'s", "1"]
)


@settings(max_examples=150, deadline=None)
@given(
    parts=st.lists(TEXT_ALPHABET, min_size=0, max_size=120),
    limit=st.sampled_from([None, 16, 20, 40]),
)
def test_bounded_counting_equals_the_full_count(
    minilm_path: Path, parts: list[str], limit: Any
) -> None:
    """Property: chunked, bounded counting of long texts gives exactly what the tokenizer
    gives on the whole text, whenever the count is below the bound (and saturates above)."""
    import proxy.tokenizer as module

    full = _shared(minilm_path)
    bounded = full.copy()
    bounded.bound = 30
    text = "".join(parts)
    with _small_chunks(module):
        exact = full.lengths([text], max_length=limit)[0]
        got = bounded.lengths([text], max_length=limit)[0]
        offsets = bounded.content_offsets(text)
        pair = bounded.pair_length(text, "Paris.", max_length=limit, only_second=False)
    if exact <= bounded.bound:
        assert got == exact
        assert offsets == full.content_offsets(text)
        exact_pair = full.pair_length(text, "Paris.", max_length=limit, only_second=False)
        assert pair == exact_pair
    else:
        assert got > bounded.bound or got == limit
        assert offsets[: bounded.bound] == full.content_offsets(text)[: bounded.bound]


def test_long_text_memory_follows_the_chunk(minilm_path: Path) -> None:
    """A 4 MiB text of one-character words is counted through 16 KiB chunks and stops at
    the bound: the tokenizer never sees more than one chunk."""
    tok = load_tokenizer(minilm_path)
    tok.bound = 258
    seen: list[int] = []
    inner = tok._tok

    def spy(text: Any, **kwargs: Any) -> Any:
        seen.append(len(text) if isinstance(text, str) else sum(map(len, text)))
        return inner(text, **kwargs)

    tok._tok = spy
    assert tok.lengths(["a " * (2 * 1024 * 1024)], max_length=257) == [257]
    assert max(seen) <= 16 * 1024
    assert len(seen) == 1  # 16 KiB of "a " is already 8,192 tokens, past the bound


_SHARED: dict[Path, HFTokenizer] = {}


def _shared(path: Path) -> HFTokenizer:
    if path not in _SHARED:
        _SHARED[path] = load_tokenizer(path)
    return _SHARED[path]


@contextlib.contextmanager
def _small_chunks(module: Any) -> Iterator[None]:
    saved = module.LONG_TEXT_CHARS, module.CHUNK_CHARS
    module.LONG_TEXT_CHARS, module.CHUNK_CHARS = 8, 6
    try:
        yield
    finally:
        module.LONG_TEXT_CHARS, module.CHUNK_CHARS = saved


def test_real_size_long_text_counts_like_the_whole_text(minilm_path: Path) -> None:
    """A 105 KB document (chunked path) gives the unbounded tokenizer's truncated count
    and the same leading offsets, as vLLM's renderer would see them."""
    full = load_tokenizer(minilm_path)
    bounded = load_tokenizer(minilm_path)
    bounded.bound = 258
    text = "Paris is the capital of France, naïve café 東京. " * 2200
    for limit in (16, 100, 257):
        assert bounded.lengths([text], max_length=limit) == full.lengths([text], max_length=limit)
    assert bounded.content_offsets(text)[:200] == full.content_offsets(text)[:200]


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


def test_giant_whitespace_free_run_is_not_tokenized(minilm_path: Path) -> None:
    """A 4 MiB run without whitespace would take ~290 MB of tokenizer memory: the proxy
    refuses to count it (the request is judged without a recount) instead."""
    from proxy.tokenizer import Uncountable

    tok = load_tokenizer(minilm_path)
    tok.bound = 258
    with pytest.raises(Uncountable):
        tok.lengths(["a" * (4 * 1024 * 1024)], max_length=257)
    assert tok.lengths(["a" * (40 * 1024)], max_length=257) == [3]  # one [UNK]
