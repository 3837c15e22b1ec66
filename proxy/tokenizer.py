"""Hugging Face tokenizers behind the accounting ``Tokenizer`` protocol, and a thread pool.

vLLM tokenizes through the transformers call API; so do we, never through a raw
``tokenizers.Tokenizer`` whose file-level truncation/padding settings would skew counts.
A fast tokenizer must not be used by two threads at once, so every worker thread gets its
own copy (made on first use) and no shared instance is ever mutated.
"""

from __future__ import annotations

import copy
import itertools
import os
import threading
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

    @property
    def pad_token_id(self) -> int | None:
        value = self._tok.pad_token_id
        return None if value is None else int(value)

    @property
    def truncation_side(self) -> str:
        return str(self._tok.truncation_side)

    def lengths(self, texts: Sequence[str], *, max_length: int | None) -> list[int]:
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

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
