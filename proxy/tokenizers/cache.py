"""The count cache: a shared, bounded cache of single-text token counts
(``--count-cache-size``)."""

from __future__ import annotations

import hashlib
import sys
import threading
from collections.abc import Iterator, Sequence
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

# Whose counts an entry is: the tokenizer and tenant (``Counts.cache_key``) and the limit
# the text was counted under. Entries of one scope are keyed by the text (or its digest).
_Scope = tuple[tuple[int, str], int | None]
_Key = str | bytes
_Generation = dict[_Scope, dict[_Key, int]]


class CountCache:
    """Shared cache of single-text token counts, keyed by tokenizer, tenant, limit and text.

    Rerankers see the same documents again and again; a hit skips tokenization. Short
    texts are kept as their own keys and long ones as a 16-byte digest, so memory stays
    bounded by ``size`` entries and ``held_bytes`` of text.

    Eviction is least-recently-used by generations: entries are added to the young
    generation; when it holds half the entries or half the bytes allowed, it becomes the
    old generation and the old one is dropped. A hit in the young generation is one dict
    lookup, with nothing reordered (an ordered LRU moved every hit to its end: per request,
    that cost more than the lookups); a hit in the old one moves the entry to the young
    one. So an entry is kept while it is used at least once per half-cache of new entries.
    """

    def __init__(self, size: int, held_bytes: int = HELD_TEXT_BYTES) -> None:
        self._size, self._held_limit = size, held_bytes
        self._half, self._half_held = max(1, size // 2), held_bytes // 2
        self._young: _Generation = {}
        self._old: _Generation = {}
        self._young_count = self._young_held = 0
        self._old_count = self._old_held = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @staticmethod
    def _keys(texts: Sequence[str]) -> Sequence[_Key]:
        if max(map(len, texts), default=0) <= EXACT_KEY_CHARS:  # the common case
            return texts
        return [
            t if len(t) <= EXACT_KEY_CHARS else hashlib.blake2b(t.encode(), digest_size=16).digest()
            for t in texts
        ]

    def cached(self, tok: Counts, texts: Sequence[str], max_length: int | None) -> list[int] | None:
        """Every text's count if the cache holds them all, else None (nothing counted)."""
        scope, keys = (tok.cache_key, max_length), self._keys(texts)
        with self._lock:
            found = list(map(self._young.get(scope, {}).get, keys))
            if None in found:  # some only in the old generation, or in neither
                found = [
                    self._lookup(scope, k) if c is None else c
                    for c, k in zip(found, keys, strict=True)
                ]
                if None in found:
                    return None
            self.hits += len(keys)
        return found  # type: ignore[return-value]

    def _lookup(self, scope: _Scope, key: _Key) -> int | None:
        """A count from either generation as they are now (lock held); one found in the
        old generation moves to the young one."""
        value = self._young.get(scope, {}).get(key)
        if value is None:
            value = self._old.get(scope, {}).get(key)
            if value is not None:
                self._store(scope, key, value)
        return value

    def lengths(self, tok: Counts, texts: Sequence[str], max_length: int | None) -> list[int]:
        scope, keys = (tok.cache_key, max_length), self._keys(texts)
        found: dict[int, int] = {}
        with self._lock:
            for i, key in enumerate(keys):
                value = self._lookup(scope, key)
                if value is not None:
                    found[i] = value
        missing = [i for i in range(len(texts)) if i not in found]
        counted = tok.encode_lengths([texts[i] for i in missing], max_length=max_length)
        with self._lock:
            self.hits += len(found)
            self.misses += len(missing)
            for i, n in zip(missing, counted, strict=True):
                found[i] = n
                self._store(scope, keys[i], n)
        return [found[i] for i in range(len(texts))]

    def _store(self, scope: _Scope, key: _Key, count: int) -> None:
        """Put an entry in the young generation (lock held), out of the old one; first,
        when the young generation is full, it becomes the old one (the old is dropped)."""
        size = _held(key)
        old = self._old.get(scope)
        if old is not None and old.pop(key, None) is not None:
            self._old_count -= 1
            self._old_held -= size
        young = self._young.get(scope)
        if young is not None and key in young:
            young[key] = count
            return
        if self._young_count >= self._half or self._young_held + size > self._half_held:
            self._young, self._old = {}, self._young
            self._old_count, self._old_held = self._young_count, self._young_held
            self._young_count = self._young_held = 0
        self._young.setdefault(scope, {})[key] = count
        self._young_count += 1
        self._young_held += size
        if self._over():
            # Halves round down: a cache of one entry, or an entry above half the bytes,
            # does not fit beside a full old generation; one above the whole, not at all.
            self._old, self._old_count, self._old_held = {}, 0, 0
            if self._over():
                self._young, self._young_count, self._young_held = {}, 0, 0

    def _over(self) -> bool:
        return len(self) > self._size or self.held_bytes > self._held_limit

    @property
    def held_bytes(self) -> int:
        """Bytes of text held as exact keys."""
        return self._young_held + self._old_held

    def __len__(self) -> int:
        return self._young_count + self._old_count

    def held(self) -> Iterator[_Key]:
        """Every text (or digest) held, young generation first (what the tests inspect)."""
        with self._lock:
            generations = [self._young, self._old]
            held = [
                key for generation in generations for part in generation.values() for key in part
            ]
        return iter(held)


def _held(key: _Key) -> int:
    """The memory a text held as its own key may take, the same for every equal text: an
    ASCII str's size is fixed; any other's may grow by the UTF-8 copy the tokenizer makes
    of it, so it is taken at its widest: four bytes a character and a terminator, and a
    UTF-8 copy of up to four bytes a character and a terminator."""
    if not isinstance(key, str):
        return 0
    return sys.getsizeof(key) if key.isascii() else _STR_HEADER + 8 * len(key) + 5


_STR_HEADER = sys.getsizeof("\U0001f600") - 8  # a str object less its characters
