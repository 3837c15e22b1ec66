"""The circuit breaker in front of the limits store: consecutive failures (those of
``client.STORE_ERRORS``) open it, so a dead or slow store costs a request nothing after
the first ones; after a cooldown one request tries the store again."""

from __future__ import annotations


class Breaker:
    """Consecutive store failures open it for ``cooldown`` seconds: a dead or slow store
    costs each request nothing after the first failures. After the cooldown one request
    tries the store again (half open): a success closes it, a failure opens it again."""

    def __init__(self, failures: int = 3, cooldown: float = 1.0) -> None:
        self.failures = failures
        self.cooldown = cooldown
        self.count = 0
        self.open_until = 0.0

    @property
    def open(self) -> bool:
        return self.count >= self.failures

    def allows(self, now: float) -> bool:
        if not self.open:
            return True
        if now >= self.open_until:  # half open: this one request tries
            self.open_until = now + self.cooldown
            return True
        return False

    def failed(self, now: float) -> None:
        self.count += 1
        if self.open:
            self.open_until = now + self.cooldown

    def succeeded(self) -> bool:
        """Close; whether it was open (the store is back)."""
        was = self.open
        self.count = 0
        return was
