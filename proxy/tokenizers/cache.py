"""The count cache: a shared LRU of single-text token counts (``--count-cache-size``)."""

from __future__ import annotations

import hashlib
import itertools
import sys
import threading
from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import Protocol


class Counts(Protocol):
    """A tokenizer as the cache sees it: the key its entries are kept under (the
    tokenizer and the tenant counting with it), and uncached counting."""

    cache_key: tuple[int, str]

    def encode_lengths(self, texts: Sequence[str], *, max_length: int | None) -> list[int]: ...


# Texts of at most this many characters (2 to 8 KiB of str object, by the widest
# character) are their own cache key: exact (no two texts can share an entry) and hashed
# by Python itself, several times cheaper than a digest. Longer texts are keyed by a
# 16-byte BLAKE2b digest.
EXACT_KEY_CHARS = 2048
# Bytes of text the cache may hold as exact keys, on top of its entry limit.
HELD_TEXT_BYTES = 32 * 1024 * 1024

_Key = tuple[tuple[int, str], int | None, str | bytes]


class CountCache:
    """Shared LRU of single-text token counts, keyed by tokenizer, limit and text.

    Rerankers see the same documents again and again; a hit skips tokenization. Short
    texts are kept as their own keys and long ones as a 16-byte digest, so memory stays
    bounded by ``size`` entries and ``HELD_TEXT_BYTES`` of text.
    """

    def __init__(self, size: int, held_bytes: int = HELD_TEXT_BYTES) -> None:
        self._size = size
        self._held_limit = held_bytes
        self._data: OrderedDict[_Key, int] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @staticmethod
    def _keys(tok: Counts, texts: Sequence[str], max_length: int | None) -> list[_Key]:
        if max(map(len, texts), default=0) <= EXACT_KEY_CHARS:  # the common case
            return list(zip(itertools.repeat(tok.cache_key), itertools.repeat(max_length), texts))
        return [
            (tok.cache_key, max_length, t)
            if len(t) <= EXACT_KEY_CHARS
            else (tok.cache_key, max_length, hashlib.blake2b(t.encode(), digest_size=16).digest())
            for t in texts
        ]

    def cached(self, tok: Counts, texts: Sequence[str], max_length: int | None) -> list[int] | None:
        """Every text's count if the cache holds them all, else None (nothing counted)."""
        keys = self._keys(tok, texts, max_length)
        with self._lock:
            found = list(map(self._data.get, keys))
            if None in found:
                return None
            deque(map(self._data.move_to_end, keys), maxlen=0)  # most recently used
            self.hits += len(keys)
        return found  # type: ignore[return-value]

    def lengths(self, tok: Counts, texts: Sequence[str], max_length: int | None) -> list[int]:
        keys = self._keys(tok, texts, max_length)
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
                self._store(keys[i], n)
        return [found[i] for i in range(len(texts))]

    def _store(self, key: _Key, count: int) -> None:
        """Insert (lock held), then evict the least recently used past either limit."""
        if key not in self._data:
            self._held += _held(key)
        self._data[key] = count
        while len(self._data) > self._size or self._held > self._held_limit:
            old, _ = self._data.popitem(last=False)
            self._held -= _held(old)

    @property
    def held_bytes(self) -> int:
        return self._held


def _held(key: _Key) -> int:
    text = key[2]
    return sys.getsizeof(text) if isinstance(text, str) else 0
