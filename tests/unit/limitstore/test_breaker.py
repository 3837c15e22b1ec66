"""The circuit breaker: consecutive failures open it for a cooldown, after which one
request tries the store (half open); a success closes it and says it was open."""

from __future__ import annotations

from proxy.limitstore.breaker import Breaker


def test_failures_open_it_and_a_success_closes_it() -> None:
    """Below the threshold every call goes; at it, none until the cooldown has passed,
    then one (half open) whose failure opens it again for another cooldown."""
    breaker = Breaker(failures=2, cooldown=1.0)
    breaker.failed(10.0)
    assert breaker.allows(10.0)
    breaker.failed(10.0)
    assert breaker.open
    assert not breaker.allows(10.5)
    assert breaker.allows(11.0)  # half open: this one tries
    assert not breaker.allows(11.1)  # and only this one
    breaker.failed(11.2)
    assert not breaker.allows(12.0)
    assert breaker.allows(12.2)
    assert breaker.succeeded() is True
    assert not breaker.open
    assert breaker.succeeded() is False
