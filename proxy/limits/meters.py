"""The three kinds of meter a limit keeps: a smooth rate (``rates.Rate``), a calendar
budget, and a concurrency gate. Each answers how long a cost must wait, takes it, gives
it back, and how it stands for the headers."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol
from zoneinfo import ZoneInfo

from proxy.limits.periods import period
from proxy.limits.policy import RATE_SECONDS, Limit, Window
from proxy.limits.rates import Rate

# A concurrency refusal has no clock to read: clients are told to retry after this.
GATE_RETRY_SECONDS = 1.0
# A budget whose room is held by reservations in flight may have it back this soon.
HELD_RETRY_SECONDS = 1.0

# The units a budget's scope was billed in [start, end): read from the usage history.
UsedIn = Callable[[float, float], int]


class Meter(Protocol):
    """What a limiter asks of a limit's meter (``amount``: the limit it meters)."""

    @property
    def amount(self) -> int: ...

    def wait(self, cost: int, now: float) -> float:
        """Seconds until ``cost`` fits (0: now; inf: never)."""
        ...

    def take(self, cost: int, now: float) -> None: ...

    def adjust(self, reserved: int, billed: int, now: float) -> None: ...

    def give(self, reserved: int, now: float) -> None: ...

    def standing(self, now: float) -> tuple[int, int, float]:
        """The limit, what remains of it, and the seconds until it is whole again."""
        ...

    def resize(self, amount: int) -> bool:
        """A reload changed the limit's amount; whether this meter keeps its state (a
        budget's usage, a gate's holders) at the new amount, else it is made anew."""
        ...

    def rezone(self, zone: ZoneInfo) -> None:
        """The periods' time zone in force (a budget re-reads a period in a new one)."""
        ...

    def reread(self) -> None:
        """The usage history changed: a budget re-reads its period from it."""
        ...


class RateMeter:
    def __init__(self, limit: Limit) -> None:
        assert limit.window is not None
        self.amount = limit.amount
        self.rate = Rate(limit.amount, RATE_SECONDS[limit.window])

    def wait(self, cost: int, now: float) -> float:
        return self.rate.wait(cost, now)

    def take(self, cost: int, now: float) -> None:
        self.rate.take(cost, now)

    def adjust(self, reserved: int, billed: int, now: float) -> None:
        self.rate.give(reserved - billed)

    def give(self, reserved: int, now: float) -> None:
        self.rate.give(reserved)

    def standing(self, now: float) -> tuple[int, int, float]:
        return self.amount, self.rate.remaining(now), self.rate.reset(now)

    def resize(self, amount: int) -> bool:
        return False  # a rate restarts at a new amount

    def rezone(self, zone: ZoneInfo) -> None:
        return None

    def reread(self) -> None:
        return None


class BudgetMeter:
    """Billed units of the current period (rebuilt from the usage history when a period
    starts) plus the units reserved by requests in flight."""

    def __init__(self, limit: Limit, zone: ZoneInfo, used_in: UsedIn) -> None:
        assert limit.window is not None
        assert limit.window.budget
        self.amount = limit.amount
        self.window: Window = limit.window
        self.zone = zone
        self._used_in = used_in
        self.start = self.end = -math.inf
        self.used = 0
        self.reserved = 0

    def _current(self, now: float) -> None:
        if not self.start <= now < self.end:
            self.start, self.end = period(self.window, now, self.zone)
            self.used = self._used_in(self.start, self.end)

    def wait(self, cost: int, now: float) -> float:
        self._current(now)
        if cost > self.amount:
            return math.inf
        if self.used + self.reserved + cost <= self.amount:
            return 0.0
        if self.used + cost <= self.amount:  # room comes back when reservations settle
            return min(HELD_RETRY_SECONDS, self.end - now)
        return self.end - now

    def take(self, cost: int, now: float) -> None:
        self._current(now)
        self.reserved += cost

    def adjust(self, reserved: int, billed: int, now: float) -> None:
        self._current(now)
        self.reserved -= reserved
        self.used += billed

    def give(self, reserved: int, now: float) -> None:
        self.reserved -= reserved

    def standing(self, now: float) -> tuple[int, int, float]:
        self._current(now)
        return self.amount, max(self.amount - self.used - self.reserved, 0), self.end - now

    def resize(self, amount: int) -> bool:
        self.amount = amount
        return True

    def rezone(self, zone: ZoneInfo) -> None:
        if zone != self.zone:
            self.zone = zone
            self.reread()

    def reread(self) -> None:
        self.start = self.end = -math.inf


class Gate:
    """Requests in flight."""

    def __init__(self, limit: Limit) -> None:
        self.amount = limit.amount
        self.held = 0

    def wait(self, cost: int, now: float) -> float:
        return 0.0 if self.held + cost <= self.amount else GATE_RETRY_SECONDS

    def take(self, cost: int, now: float) -> None:
        self.held += cost

    def adjust(self, reserved: int, billed: int, now: float) -> None:
        self.held -= reserved

    def give(self, reserved: int, now: float) -> None:
        self.held -= reserved

    def standing(self, now: float) -> tuple[int, int, float]:
        return self.amount, max(self.amount - self.held, 0), 0.0

    def resize(self, amount: int) -> bool:
        self.amount = amount
        return True

    def rezone(self, zone: ZoneInfo) -> None:
        return None

    def reread(self) -> None:
        return None
