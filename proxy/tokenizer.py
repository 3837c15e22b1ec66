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
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from proxy.types import Tokenizer

_keys = itertools.count()


class HFTokenizer:
    """Adapter from a transformers tokenizer to the accounting protocol."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self.key = next(_keys)
        self.cache: CountCache | None = None

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
        out = self._tok(
            list(texts),
            add_special_tokens=True,
            truncation=max_length is not None,
            max_length=max_length,
        )
        return [len(ids) for ids in out["input_ids"]]

    def pair_length(
        self, text: str, pair: str, *, max_length: int | None, only_second: bool
    ) -> int:
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
        out = self._tok(text, add_special_tokens=False, return_offsets_mapping=True)
        return [(int(a), int(b)) for a, b in out["offset_mapping"]]

    def num_special_tokens_pair(self) -> int:
        return int(self._tok.num_special_tokens_to_add(pair=True))

    def copy(self) -> HFTokenizer:
        twin = HFTokenizer(copy.deepcopy(self._tok))
        twin.key = self.key
        twin.cache = self.cache
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


class TokenizerPool:
    """Runs counting off the event loop; each worker thread owns a copy of each tokenizer."""

    def __init__(self, threads: int) -> None:
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="tokenize")
        self._local = threading.local()

    @property
    def executor(self) -> ThreadPoolExecutor:
        return self._executor

    def local_copy(self, base: HFTokenizer) -> Tokenizer:
        """This thread's own copy of ``base`` (made on first use, then reused)."""
        copies: dict[int, Tokenizer] = self._local.__dict__.setdefault("copies", {})
        mine = copies.get(base.key)
        if mine is None:
            mine = copies[base.key] = base.copy()
        return mine

    def warm(self, base: HFTokenizer) -> None:
        """Give every worker thread its copy now, not on a client's request (blocking)."""
        threads = self._executor._max_workers
        barrier = threading.Barrier(threads)

        def job() -> None:
            self.local_copy(base).lengths(["warm up"], max_length=None)
            barrier.wait(timeout=30)

        for future in [self._executor.submit(job) for _ in range(threads)]:
            future.result(timeout=60)

    def shutdown(self) -> None:
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
