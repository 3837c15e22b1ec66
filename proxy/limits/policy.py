"""The ``--limits`` file: a contract (docs and outside checks rely on its shape; it may
grow, never change). Validated whole with pydantic before it replaces the one in use."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any
from zoneinfo import ZoneInfo

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    field_validator,
    model_validator,
)

from proxy.accounting.money import MOST_BUDGET, Amount, from_nanos, nanos_up, read_yaml
from proxy.accounting.zones import TimeZone


class Unit(enum.StrEnum):
    REQUESTS = "requests"
    PROMPT = "prompt_tokens"
    COMPLETION = "completion_tokens"
    TOTAL = "total_tokens"
    COST = "cost"  # money, in billionths of the --prices file's currency


class Window(enum.StrEnum):
    SECOND = "second"
    MINUTE = "minute"
    HOUR = "hour"
    DAY = "day"
    WEEK = "week"
    MONTH = "month"

    @property
    def budget(self) -> bool:
        """Calendar periods (reset on exact boundaries) rather than smooth rates."""
        return self in (Window.DAY, Window.WEEK, Window.MONTH)


RATE_SECONDS = {Window.SECOND: 1.0, Window.MINUTE: 60.0, Window.HOUR: 3600.0}


@dataclass(frozen=True, slots=True)
class Limit:
    """One ``<unit>_per_<window>`` limit (or ``concurrency``: unit requests, no window)."""

    unit: Unit
    window: Window | None
    amount: int
    name: str = field(init=False, compare=False)
    tokens: bool = field(init=False, compare=False)  # a token limit, not a request one
    money: bool = field(init=False, compare=False)  # a money budget (``cost_per_*``)
    budget: bool = field(init=False, compare=False)  # a calendar budget, not a rate

    def __post_init__(self) -> None:
        name = "concurrency" if self.window is None else f"{self.unit}_per_{self.window}"
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "tokens", self.unit not in (Unit.REQUESTS, Unit.COST))
        object.__setattr__(self, "money", self.unit is Unit.COST)
        object.__setattr__(self, "budget", self.window is not None and self.window.budget)

    @property
    def priced(self) -> bool:
        """Whether a request's count is needed before forwarding (tokens, or money)."""
        return self.tokens or self.money


def _budget(value: Decimal) -> Decimal:
    """A money budget: above zero, whole billionths (what a limiter counts), and well
    inside what the shared store's doubles count exactly."""
    if value <= 0:
        raise ValueError(f"{value} is not above zero")
    if from_nanos(nanos_up(value)) != value:
        raise ValueError(f"{value} has more than 9 decimal places")
    if value > MOST_BUDGET:
        raise ValueError(f"{value} is above {MOST_BUDGET:,}, the most a budget may be")
    return value


Money = Annotated[Amount, AfterValidator(_budget)]
# Money is budgeted by calendar periods only: a smooth rate's arrival time (a double of
# Unix seconds) cannot advance by a billionth's share of a window.
MONEY_RATES = ("cost_per_second", "cost_per_minute", "cost_per_hour")


class Limits(BaseModel):
    """The limits of one level (default, tenant, tenant x model, key)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests_per_second: PositiveInt | None = None
    requests_per_minute: PositiveInt | None = None
    requests_per_hour: PositiveInt | None = None
    requests_per_day: PositiveInt | None = None
    requests_per_week: PositiveInt | None = None
    requests_per_month: PositiveInt | None = None
    prompt_tokens_per_second: PositiveInt | None = None
    prompt_tokens_per_minute: PositiveInt | None = None
    prompt_tokens_per_hour: PositiveInt | None = None
    prompt_tokens_per_day: PositiveInt | None = None
    prompt_tokens_per_week: PositiveInt | None = None
    prompt_tokens_per_month: PositiveInt | None = None
    completion_tokens_per_second: PositiveInt | None = None
    completion_tokens_per_minute: PositiveInt | None = None
    completion_tokens_per_hour: PositiveInt | None = None
    completion_tokens_per_day: PositiveInt | None = None
    completion_tokens_per_week: PositiveInt | None = None
    completion_tokens_per_month: PositiveInt | None = None
    total_tokens_per_second: PositiveInt | None = None
    total_tokens_per_minute: PositiveInt | None = None
    total_tokens_per_hour: PositiveInt | None = None
    total_tokens_per_day: PositiveInt | None = None
    total_tokens_per_week: PositiveInt | None = None
    total_tokens_per_month: PositiveInt | None = None
    cost_per_day: Money | None = None
    cost_per_week: Money | None = None
    cost_per_month: Money | None = None
    concurrency: PositiveInt | None = None

    @model_validator(mode="before")
    @classmethod
    def _no_money_rates(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name in MONEY_RATES:
                if name in data:
                    raise ValueError(
                        f"{name}: money is budgeted per calendar period: "
                        "cost_per_day, cost_per_week or cost_per_month"
                    )
        return data

    def limits(self) -> tuple[Limit, ...]:
        """The limits set at this level (read once: every admission asks)."""
        return self._read

    # Caches are cached properties, not pydantic private attributes: reading one of those
    # raises and catches an AttributeError inside pydantic, about 10 us a read.
    @cached_property
    def _read(self) -> tuple[Limit, ...]:
        out = []
        for name, value in self:
            if isinstance(value, Decimal) and name in MONEY_NAMES:
                window = name.rpartition("_per_")[2]
                out.append(Limit(Unit.COST, Window(window), nanos_up(value)))
                continue
            if value is None or not isinstance(value, int):
                continue
            if name == "concurrency":
                out.append(Limit(Unit.REQUESTS, None, value))
                continue
            unit, _, window = name.rpartition("_per_")
            out.append(Limit(Unit(unit), Window(window), value))
        return tuple(out)


LEVELS_HELD = 10_000
# The field names that are amounts (what a replica's share divides).
LIMIT_NAMES = frozenset(name for name in Limits.model_fields if name != "fail_mode")
MONEY_NAMES = frozenset(name for name in LIMIT_NAMES if name.startswith("cost_per_"))

# Records name a key by the first hex digits of its SHA-256 (``key_hash``).
KEY_HASH_DIGITS = 12


class FailMode(enum.StrEnum):
    """What admission does while the shared limits store is unreachable."""

    CLOSED = "closed"  # refuse (503): nothing is forwarded
    OPEN = "open"  # admit, log, count
    LOCAL = "local"  # each replica enforces its share (of what is left of a budget)


class TenantLimits(Limits):
    """A tenant's limits, with narrower ones per served model and per key (its SHA-256
    hex digest as in the ``--api-keys`` file, or the records' shorter ``key_hash``);
    ``fail_mode`` overrides ``--limits-fail-mode`` for this tenant."""

    fail_mode: FailMode | None = None
    models: dict[str, Limits] = Field(default_factory=dict)
    keys: dict[str, Limits] = Field(default_factory=dict)

    @field_validator("keys")
    @classmethod
    def _as_key_hashes(cls, value: dict[str, Limits]) -> dict[str, Limits]:
        return {digest.lower()[:KEY_HASH_DIGITS]: limits for digest, limits in value.items()}


class Policies(BaseModel):
    """The whole file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    timezone: TimeZone = "UTC"
    default: Limits | None = None
    tenants: dict[str, TenantLimits] = Field(default_factory=dict)

    # Levels already worked out, by (tenant, model, key); dropped whole past LEVELS_HELD.
    @cached_property
    def _levels(self) -> dict[tuple[str, str | None, str | None], tuple[Level, ...]]:
        return {}

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    def levels(self, tenant: str, model: str | None, key: str | None) -> tuple[Level, ...]:
        """Every level that applies to a request; it must have room at each."""
        found = self._levels.get((tenant, model, key))
        if found is None:
            if len(self._levels) >= LEVELS_HELD:
                self._levels.clear()
            found = self._levels[tenant, model, key] = tuple(self._find(tenant, model, key))
        return found

    def _find(self, tenant: str, model: str | None, key: str | None) -> list[Level]:
        own = self.tenants.get(tenant)
        if own is None:
            return [Level(("tenant", tenant), self.default.limits())] if self.default else []
        levels = [Level(("tenant", tenant), own.limits())]
        if model is not None and model in own.models:
            levels.append(Level(("model", tenant, model), own.models[model].limits()))
        if key is not None and key in own.keys:
            levels.append(Level(("key", tenant, key), own.keys[key].limits()))
        return [level for level in levels if level.limits]

    def fail_mode(self, tenant: str, default: FailMode) -> FailMode:
        """The tenant's fail mode (its own, else ``default``)."""
        own = self.tenants.get(tenant)
        return own.fail_mode if own is not None and own.fail_mode is not None else default

    def divided(self, replicas: int) -> Policies:
        """Every amount divided by ``replicas`` (rounded down, at least 1): a replica's
        share while the shared store is unreachable; the sum never exceeds the limit
        (beyond 1 per replica for a limit smaller than the replica count)."""
        if replicas <= 1:
            return self

        def divide(name: str, value: Any) -> Any:
            if name in MONEY_NAMES and isinstance(value, Decimal):  # whole billionths
                return from_nanos(max(nanos_up(value) // replicas, 1))
            if name in LIMIT_NAMES and isinstance(value, int):
                return max(value // replicas, 1)
            return share(value)

        def share(data: Any) -> Any:
            if isinstance(data, dict):
                return {name: divide(name, value) for name, value in data.items()}
            return data

        return Policies.model_validate(share(self.model_dump(exclude_none=True)))

    def wants_tokens(self, tenant: str) -> bool:
        """Whether any token or money limit may apply to the tenant (its count is then
        needed before forwarding)."""
        named, default = self.priced_tenants
        return tenant in named if tenant in self.tenants else default

    @cached_property
    def priced_tenants(self) -> tuple[frozenset[str], bool]:
        """The tenants a token or money limit may apply to, and whether the default's may:
        read once (every metered request asks, a scoring one twice; a pydantic private
        attribute would cost an AttributeError raised and caught per read)."""

        def priced(every: Iterable[Limits]) -> bool:
            return any(x.priced for limits in every for x in limits.limits())

        named = frozenset(
            tenant
            for tenant, own in self.tenants.items()
            if priced([own, *own.models.values(), *own.keys.values()])
        )
        return named, self.default is not None and priced([self.default])

    def money_applies(self, tenant: str, model: str | None, key: str | None) -> bool:
        """Whether a money budget is among the limits of such a request."""
        levels = self.levels(tenant, model, key)
        return any(limit.money for level in levels for limit in level.limits)

    def budgeted_models(self) -> tuple[bool, frozenset[str]]:
        """Which models a money budget applies to: every model (a default's, a tenant's
        or a key's budget), and the models named by a tenant's ``models`` budgets."""

        def money(limits: Limits) -> bool:
            return any(limit.money for limit in limits.limits())

        every = self.default is not None and money(self.default)
        named: set[str] = set()
        for own in self.tenants.values():
            every = every or money(own) or any(money(k) for k in own.keys.values())
            named.update(m for m, limits in own.models.items() if money(limits))
        return every, frozenset(named)


@dataclass(frozen=True, slots=True)
class Level:
    """One level of limits and the key its state is kept under."""

    scope: tuple[str, ...]
    limits: tuple[Limit, ...]


def load_policies(path: Path) -> Policies:
    """Read and validate a limits file (YAML or JSON); raises on anything wrong."""
    data: Any = read_yaml(path.read_text(encoding="utf-8"))  # 250.00 is a Decimal
    if data is None:
        data = {}
    return Policies.model_validate(data)
