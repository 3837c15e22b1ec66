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

from proxy.tokenizers.cache import CountCache
from proxy.tokenizers.hf import HFTokenizer, load_tokenizer
from proxy.tokenizers.pool import TokenizerPool

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
    import proxy.tokenizers.hf as module

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
    import proxy.tokenizers.hf as module

    inner = module.backend_lengths

    def spy(tokenizer: Any, texts: list[str], **kwargs: Any) -> Any:
        seen.append(sum(map(len, texts)))
        return inner(tokenizer, texts, **kwargs)

    module.backend_lengths = spy  # type: ignore[assignment]
    try:
        assert tok.lengths(["a " * (2 * 1024 * 1024)], max_length=257) == [257]
    finally:
        module.backend_lengths = inner  # type: ignore[assignment]
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
    from proxy.accounting.types import Uncountable

    tok = load_tokenizer(minilm_path)
    tok.bound = 258
    with pytest.raises(Uncountable):
        tok.lengths(["a" * (4 * 1024 * 1024)], max_length=257)
    assert tok.lengths(["a" * (40 * 1024)], max_length=257) == [3]  # one [UNK]


def _call_lengths(tok: Any, texts: list[str], limit: int | None) -> list[int]:
    """What vLLM's path (the transformers call) gives for each text."""
    out = tok(texts, add_special_tokens=True, truncation=limit is not None, max_length=limit)
    return [len(ids) for ids in out["input_ids"]]


COUNTER_ALPHABET = st.sampled_from(
    [
        "a",
        "é",
        "字",
        "한",
        "🙂",
        " ",
        "\n",
        "\t",
        ".",
        "word",
        "THE",
        "[SEP]",
        "[CLS]",
        "[PAD]",
        "[UNK]",
        "[MASK]",
        "\u200b",
        "\x00",
        "ﬁ",
        "Å",
        "\u0301",
    ]
)


@settings(max_examples=200, deadline=None)
@given(
    texts=st.lists(st.lists(COUNTER_ALPHABET, max_size=60).map("".join), min_size=1, max_size=6),
    limit=st.sampled_from([None, 16, 17, 30, 257]),
)
def test_length_counter_equals_the_transformers_call(
    minilm_path: Path, texts: list[str], limit: int | None
) -> None:
    """Property: counting on the backend (no ids, masks or offsets) gives the length the
    transformers call gives, for every text and cap, special-token strings included."""
    tok = _shared(minilm_path)
    assert tok.encode_lengths(texts, max_length=limit) == _call_lengths(tok._tok, texts, limit)


def test_length_counter_ignores_the_files_truncation_and_padding(
    minilm_path: Path, tmp_path: Path
) -> None:
    """A tokenizer.json that truncates and pads by itself (some hub files do) does not
    change counts: the transformers call overrides those settings, and so does the
    backend counter; the two can be used in any order."""
    import json
    import shutil

    target = tmp_path / "tok"
    shutil.copytree(minilm_path, target)
    spec = json.loads((target / "tokenizer.json").read_text())
    spec["truncation"] = {
        "direction": "Right",
        "max_length": 8,
        "strategy": "LongestFirst",
        "stride": 0,
    }
    spec["padding"] = {
        "strategy": {"Fixed": 64},
        "direction": "Right",
        "pad_to_multiple_of": None,
        "pad_id": 0,
        "pad_type_id": 0,
        "pad_token": "[PAD]",
    }
    (target / "tokenizer.json").write_text(json.dumps(spec))
    odd, plain = load_tokenizer(target), _shared(minilm_path)
    texts = ["x " * 40, "Paris", ""]
    for limit in (None, 20):
        want = _call_lengths(plain._tok, texts, limit)
        assert odd.encode_lengths(texts, max_length=limit) == want
        assert _call_lengths(odd._tok, texts, limit) == want
    assert want == [20, 3, 2]
    # The call just left truncation at 20 on the backend; the counter undoes it.
    assert odd.encode_lengths(texts, max_length=None) == _call_lengths(plain._tok, texts, None)


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
