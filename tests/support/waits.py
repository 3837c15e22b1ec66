"""Waiting for a condition that the proxy's background work makes true."""

from __future__ import annotations

import asyncio
from typing import Any


async def eventually(check: Any, seconds: float = 10.0) -> None:
    """Await ``check()`` every 50 ms until it is true; fail after ``seconds``."""
    for _ in range(int(seconds / 0.05)):
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not met in time")
