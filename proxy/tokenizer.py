"""Hugging Face tokenizers behind the accounting ``Tokenizer`` protocol, and a thread pool.

vLLM tokenizes through the transformers call API; so do we, never through a raw
``tokenizers.Tokenizer`` whose file-level truncation/padding settings would skew counts.
A fast tokenizer must not be used by two threads at once, so every worker thread gets its
own copy (made on first use) and no shared instance is ever mutated.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from proxy.types import Tokenizer

_keys = itertools.count()
# Texts longer than this are counted chunk by chunk, each chunk ending before a
# whitespace character (a pre-token boundary for the BERT, Metaspace and byte-level
# pre-tokenizers), stopping once the count passes the bound: the tokenizer's memory then
# follows the chunk, not the text (one 2 MiB text used to take ~600 MB).
LONG_TEXT_CHARS = 32 * 1024
CHUNK_CHARS = 16 * 1024
# A whitespace-free run is one pre-token and must be tokenized whole (about 70 MB of
# tokenizer memory per MiB with MiniLM); longer runs are not counted at all.
MAX_RUN_CHARS = 64 * 1024


class Uncountable(ValueError):
    """A text the proxy will not tokenize within its memory bound; the request is judged
    without a recount (the derivation path, else ``unaudited``: billed as reported)."""


_LAST_SPACE = re.compile(r"\s\S*\Z")
_SPACE = re.compile(r"\s")


def whitespace_chunks(text: str, size: int) -> list[tuple[int, int]]:
    """(start, end) pieces of ``text`` of about ``size`` characters, each cut right before
    a whitespace character; a whitespace-free run longer than ``size`` stays whole, and
    one longer than MAX_RUN_CHARS raises Uncountable."""
    pieces: list[tuple[int, int]] = []
    start = 0
    while len(text) - start > size:
        last = _LAST_SPACE.search(text, start + 1, start + size + 1)
        cut = last.start() if last else _next_space(text, start + size)
        end = len(text) if cut < 0 else cut
        if end - start > MAX_RUN_CHARS:
            raise Uncountable(f"a whitespace-free run of more than {MAX_RUN_CHARS} characters")
        if cut < 0:
            break
        pieces.append((start, cut))
        start = cut
    pieces.append((start, len(text)))
    return pieces


def _next_space(text: str, low: int) -> int:
    found = _SPACE.search(text, low)
    return found.start() if found else -1


class HFTokenizer:
    """Adapter from a transformers tokenizer to the accounting protocol."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self.key = next(_keys)
        self.cache: CountCache | None = None
        # Token counts above this never matter (set to max_model_len + 2 by discovery: any
        # engine input longer than max_model_len is refused or cut by vLLM); None: exact.
        self.bound: int | None = None
        self._specials = int(tokenizer.num_special_tokens_to_add(pair=False))

    @property
    def pad_token_id(self) -> int | None:
        value = self._tok.pad_token_id
        return None if value is None else int(value)

    @property
    def truncation_side(self) -> str:
        return str(self._tok.truncation_side)

    def lengths(self, texts: Sequence[str], *, max_length: int | None) -> list[int]:
        if self.cache is not None:
            return self.cache.lengths(self, texts, max_length)
        return self.encode_lengths(texts, max_length=max_length)

    def encode_lengths(self, texts: Sequence[str], *, max_length: int | None) -> list[int]:
        if not texts:
            return []
        long = {i for i, t in enumerate(texts) if self._is_long(t)}
        short = [t for i, t in enumerate(texts) if i not in long]
        counted = iter(self._batch_lengths(short, max_length) if short else [])
        out = []
        for i, text in enumerate(texts):
            if i in long:
                n = self._content_length(text) + self._specials
                out.append(n if max_length is None else min(n, max_length))
            else:
                out.append(next(counted))
        return out

    def _batch_lengths(self, texts: Sequence[str], max_length: int | None) -> list[int]:
        out = self._tok(
            list(texts),
            add_special_tokens=True,
            truncation=max_length is not None,
            max_length=max_length,
        )
        return [len(ids) for ids in out["input_ids"]]

    def _is_long(self, text: str) -> bool:
        return self.bound is not None and len(text) > LONG_TEXT_CHARS

    def _content_length(self, text: str) -> int:
        """Content tokens of a long text, chunk by chunk, stopping past the bound."""
        assert self.bound is not None
        total = 0
        for start, end in whitespace_chunks(text, CHUNK_CHARS):
            out = self._tok(text[start:end], add_special_tokens=False)
            total += len(out["input_ids"])
            if total > self.bound:
                break
        return total

    def pair_length(
        self, text: str, pair: str, *, max_length: int | None, only_second: bool
    ) -> int:
        if self._is_long(text) or self._is_long(pair):
            # [CLS] q [SEP] d [SEP]: truncation keeps max_length when it can (vLLM answers
            # 400 when only_second cannot reach it; the count is then never billed).
            total = (
                self._content_length(text)
                + self._content_length(pair)
                + self.num_special_tokens_pair()
            )
            return total if max_length is None else min(total, max_length)
        truncation: bool | str = max_length is not None
        if only_second:
            truncation = "only_second"
        out = self._tok(
            text=text,
            text_pair=pair,
            add_special_tokens=True,
            truncation=truncation,
            max_length=max_length,
        )
        return len(out["input_ids"])

    def content_offsets(self, text: str) -> list[tuple[int, int]]:
        if not self._is_long(text):
            out = self._tok(text, add_special_tokens=False, return_offsets_mapping=True)
            return [(int(a), int(b)) for a, b in out["offset_mapping"]]
        assert self.bound is not None
        offsets: list[tuple[int, int]] = []
        for start, end in whitespace_chunks(text, CHUNK_CHARS):
            out = self._tok(text[start:end], add_special_tokens=False, return_offsets_mapping=True)
            offsets.extend((start + int(a), start + int(b)) for a, b in out["offset_mapping"])
            if len(offsets) > self.bound:
                break
        return offsets

    def num_special_tokens_pair(self) -> int:
        return int(self._tok.num_special_tokens_to_add(pair=True))

    def copy(self) -> HFTokenizer:
        twin = HFTokenizer(copy.deepcopy(self._tok))
        twin.key = self.key
        twin.cache = self.cache
        twin.bound = self.bound
        return twin


def load_tokenizer(source: str | Path) -> HFTokenizer:
    """Load a tokenizer from a local directory or the local HF cache, never the network."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    tok = AutoTokenizer.from_pretrained(str(source), local_files_only=True)
    if not getattr(tok, "is_fast", False):
        raise ValueError(f"{source}: a fast tokenizer is required (offset mappings)")
    return HFTokenizer(tok)


# Bodies up to this size count in their own lane, so a neighbour's multi-MiB request
# never makes a small one wait for a tokenizer thread (and lose its proof to the timeout).
SMALL_BODY_BYTES = 256 * 1024


class TokenizerPool:
    """Runs counting off the event loop in two lanes (small bodies, large bodies); each
    worker thread owns a copy of each tokenizer."""

    def __init__(self, threads: int) -> None:
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="tokenize")
        self._small = ThreadPoolExecutor(1, thread_name_prefix="tokenize-small")
        self._local = threading.local()

    @property
    def executor(self) -> ThreadPoolExecutor:
        return self._executor

    def lane(self, body_bytes: int) -> ThreadPoolExecutor:
        """The executor for a body of this size."""
        return self._small if body_bytes <= SMALL_BODY_BYTES else self._executor

    def local_copy(self, base: HFTokenizer) -> Tokenizer:
        """This thread's own copy of ``base`` (made on first use, then reused)."""
        copies: dict[int, Tokenizer] = self._local.__dict__.setdefault("copies", {})
        mine = copies.get(base.key)
        if mine is None:
            mine = copies[base.key] = base.copy()
        return mine

    def warm(self, base: HFTokenizer) -> None:
        """Give every worker thread its copy now, not on a client's request (blocking)."""
        for executor in (self._executor, self._small):
            threads = executor._max_workers
            barrier = threading.Barrier(threads)

            def job(barrier: threading.Barrier = barrier) -> None:
                self.local_copy(base).lengths(["warm up"], max_length=None)
                barrier.wait(timeout=30)

            for future in [executor.submit(job) for _ in range(threads)]:
                future.result(timeout=60)

    def shutdown(self) -> None:
        self._small.shutdown(wait=True, cancel_futures=True)
        self._executor.shutdown(wait=True, cancel_futures=True)


class CountCache:
    """Shared LRU of single-text token counts, keyed by tokenizer, limit and text digest.

    Rerankers see the same documents again and again; a hit skips tokenization. Keys hold a
    16-byte digest, not the text, so memory stays bounded by ``size`` entries.
    """

    def __init__(self, size: int) -> None:
        self._size = size
        self._data: OrderedDict[tuple[int, int | None, bytes], int] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def lengths(self, tok: HFTokenizer, texts: Sequence[str], max_length: int | None) -> list[int]:
        keys = [
            (tok.key, max_length, hashlib.blake2b(t.encode(), digest_size=16).digest())
            for t in texts
        ]
        found: dict[int, int] = {}
        with self._lock:
            for i, key in enumerate(keys):
                value = self._data.get(key)
                if value is not None:
                    self._data.move_to_end(key)
                    found[i] = value
        missing = [i for i in range(len(texts)) if i not in found]
        counted = tok.encode_lengths([texts[i] for i in missing], max_length=max_length)
        with self._lock:
            self.hits += len(found)
            self.misses += len(missing)
            for i, n in zip(missing, counted, strict=True):
                found[i] = n
                self._data[keys[i]] = n
            while len(self._data) > self._size:
                self._data.popitem(last=False)
        return [found[i] for i in range(len(texts))]
