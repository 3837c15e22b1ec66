"""Settlements and releases the store missed are sent again once it answers: a release
missed during a blip does not hold the gate, and the rest go in the background."""

from __future__ import annotations

import time

from proxy.limits.limiter import Cost, Who
from proxy.limits.policy import Policies
from tests.support.limitstores import ACME, MakeGuarded, acme_held, policies


async def test_a_release_missed_during_a_blip_does_not_hold_the_gate(
    make_guarded: MakeGuarded,
) -> None:
    """concurrency 1: a request admitted by the store ends while the breaker is open (its
    release cannot reach the store); once the store answers again the tenant's next
    request is admitted, not refused by the finished request's hold."""
    limiter = make_guarded(policies(concurrency=1), "r0", replicas=1)
    await limiter.restore([], time.time())
    assert await limiter.contribute() is True
    first = await limiter.reserve(ACME, Cost(0, 0), time.time())
    assert first.ticket is not None
    limiter.calls.breaker.count, limiter.calls.breaker.open_until = 3, time.monotonic() + 60
    await limiter.release(first.ticket, time.time())  # the store is skipped
    limiter.calls.breaker.count, limiter.calls.breaker.open_until = 0, 0.0  # the blip is over
    second = await limiter.reserve(ACME, Cost(0, 0), time.time())
    assert second.ticket is not None


async def test_missed_ends_are_sent_again_in_the_background(make_guarded: MakeGuarded) -> None:
    """A release missed while the breaker was open is sent again once the store answers
    another tenant's admission, so the tenant's hold is gone before it asks again."""
    pols = Policies.model_validate(
        {"tenants": {"acme": {"concurrency": 1}, "globex": {"concurrency": 5}}}
    )
    limiter = make_guarded(pols, "r0", replicas=1)
    await limiter.restore([], time.time())
    assert await limiter.contribute() is True
    first = await limiter.reserve(ACME, Cost(0, 0), time.time())
    assert first.ticket is not None
    limiter.calls.breaker.count, limiter.calls.breaker.open_until = 3, time.monotonic() + 60
    await limiter.release(first.ticket, time.time())
    assert len(limiter.replay.missed) == 1
    assert await acme_held(limiter) == 1  # the store still holds it
    limiter.calls.breaker.count, limiter.calls.breaker.open_until = 0, 0.0
    other = await limiter.reserve(Who("globex"), Cost(0, 0), time.time())
    assert other.ticket is not None
    assert limiter.replay._replaying is not None
    await limiter.replay._replaying
    assert limiter.replay.missed == {}
    assert await acme_held(limiter) == 0
