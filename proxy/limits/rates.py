"""Smooth rates: GCRA (the generic cell rate algorithm) over explicit timestamps.

A limit of ``amount`` units per ``window`` seconds is a bucket of ``amount`` units that
refills continuously at ``amount / window`` per second: a burst of the whole amount is
allowed, then one unit every ``interval`` seconds. The only state is the theoretical
arrival time ``tat``: the moment the bucket would be full again. No fixed windows, so no
double burst at a window's edge.
"""

from __future__ import annotations

import math

# Float arithmetic over seconds: a cost that lands this close to the edge fits.
EPSILON = 1e-9


class Rate:
    """One rate limit's state (``amount`` units per ``window`` seconds)."""

    def __init__(self, amount: int, window: float, tat: float = 0.0) -> None:
        self.amount = amount
        self.window = window
        self.interval = window / amount
        self.tat = tat  # the theoretical arrival time (GCRA); a store's, when read from one

    def wait(self, cost: int, now: float) -> float:
        """Seconds until ``cost`` units fit (0: they fit now; ``inf``: never, the cost
        alone exceeds the whole bucket)."""
        if cost > self.amount:
            return math.inf
        after = max(self.tat, now) + cost * self.interval
        return max(after - self.window - now, 0.0) if after - now > self.window + EPSILON else 0.0

    def take(self, cost: int, now: float) -> None:
        """Spend ``cost`` units (checked or not: a settlement above its reservation is
        spent all the same, and later requests wait for it)."""
        self.tat = max(self.tat, now) + cost * self.interval

    def give(self, cost: int) -> None:
        """Return ``cost`` units taken earlier (a release, or a settlement below the
        reservation); the bucket never holds more than its amount (``max`` in ``take``)."""
        self.tat -= cost * self.interval

    def remaining(self, now: float) -> int:
        """Units that fit now."""
        room = self.window - max(self.tat - now, 0.0)
        return max(min(self.amount, math.floor(room / self.interval + EPSILON)), 0)

    def reset(self, now: float) -> float:
        """Seconds until the bucket is full again."""
        return max(self.tat - now, 0.0)
