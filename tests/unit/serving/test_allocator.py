"""Giving memory back to the system: the C library is found once."""

from __future__ import annotations

import pytest


def test_the_c_library_is_looked_up_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: every trim after a large body ran ctypes.util.find_library (it spawns
    ldconfig, about 2 ms) on the event loop; the lookup now happens once."""
    import ctypes.util

    from proxy.serving import allocator

    calls: list[str] = []
    real = ctypes.util.find_library

    def counting(name: str) -> str | None:
        calls.append(name)
        return real(name)

    allocator._libc.cache_clear()
    monkeypatch.setattr(ctypes.util, "find_library", counting)
    try:
        for _ in range(3):
            allocator.malloc_trim()
        allocator.tune_allocator()
    finally:
        allocator._libc.cache_clear()
    assert calls == ["c"]
