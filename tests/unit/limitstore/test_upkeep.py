"""The shared limiter's lifetime while the application serves, time scaled down: the
heartbeat beats, the holds are renewed as often as documented, and the limiter closes."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from proxy.limitstore import upkeep
from tests.support.limitstores import MakeGuarded, policies


async def test_holds_are_renewed_every_third_of_the_ttl_as_documented(
    make_guarded: MakeGuarded, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Time scaled down (a 0.05 s heartbeat, a 3 s TTL: TTL / 3 = 1 s): over 0.35 s the
    heartbeat task renews the holds once (at its start), as documented, not every
    heartbeat (7 times)."""
    monkeypatch.setattr(upkeep, "HEARTBEAT_SECONDS", 0.05)
    limiter = make_guarded(policies(concurrency=1), "r0", replicas=1)
    limiter.shared.reservation_ttl = 3.0
    renewals = 0
    renew = limiter.renew

    async def counted() -> int | None:
        nonlocal renewals
        renewals += 1
        return await renew()

    monkeypatch.setattr(limiter, "renew", counted)
    ctx = limiter.lifetime(journaled=False)(None)
    await ctx.__anext__()
    await asyncio.sleep(0.35)
    with contextlib.suppress(StopAsyncIteration):
        await ctx.__anext__()
    assert renewals <= 1, f"{renewals} renewals in 0.35 s with a 3 s TTL"


async def test_the_lifetime_beats_and_closes(make_guarded: MakeGuarded) -> None:
    """Without a journal the replica contributes at once: its first heartbeat counts it
    in the registry; once the application stops, the limiter's client is closed."""
    limiter = make_guarded(policies(prompt_tokens_per_day=100), "r0", replicas=1)
    ctx = limiter.lifetime(journaled=False)(None)
    await ctx.__anext__()
    await asyncio.sleep(0.2)
    assert limiter.contribution.generation is not None  # contributed, by its heartbeat
    with contextlib.suppress(StopAsyncIteration):
        await ctx.__anext__()
    assert limiter.calls.errors == {}
