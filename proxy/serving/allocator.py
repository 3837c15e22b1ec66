"""The C library's allocator, tuned and trimmed, so memory freed after large bodies goes
back to the system (docs/reliability.md has the measurements)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable
from typing import Any


@functools.cache
def _libc() -> Any:
    """The C library, looked up once (find_library runs ldconfig, too slow for a request)."""
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name else None


M_MMAP_THRESHOLD, M_ARENA_MAX = -3, -8


def tune_allocator() -> None:
    """glibc: serve buffers above 256 KiB (bodies, parsed documents) from their own
    mappings, returned to the system when freed, and keep two arenas instead of one per
    thread, so the heap does not keep what large bodies held. Call before threads start."""
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, 256 * 1024)
        mallopt(M_ARENA_MAX, 2)


def malloc_trim() -> Callable[[int], Any] | None:
    """glibc's ``malloc_trim`` (hands the heap's free pages back), or None elsewhere."""
    return getattr(_libc(), "malloc_trim", None)
