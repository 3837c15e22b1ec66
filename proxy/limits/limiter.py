"""The limiter seam: what admission asks of a limiter (reserve, settle, release, restore)
and what it answers. The limiters that implement it live in ``proxy.limitstore``: in this
process's memory, or on a store shared by replicas (one atomic script per admission),
which serving uses without knowing which."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from proxy.limits.policy import Limit, Policies, Unit

# What a limiter runs while the application serves, as an aiohttp ``cleanup_ctx`` (called
# with the application): set up before the yield, torn down after.
Lifetime = Callable[[Any], AsyncIterator[None]]

# A budget refusal whose reset is further than this tells clients not to retry
# (``x-should-retry: false``): openai-python would otherwise retry, in vain.
DISTANT_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class Cost:
    """Units of one request: reserved before forwarding, or billed by its record.
    ``money`` is its price in billionths of the price file's currency (``accounting.money``:
    a reservation's bound and a record's amount, each rounded up to a billionth), an
    integer like every other unit, so a limiter and its store count it as they count
    tokens."""

    prompt: int = 0
    completion: int = 0
    requests: int = 1
    money: int = 0

    def of(self, unit: Unit) -> int:
        if unit is Unit.REQUESTS:
            return self.requests
        if unit is Unit.PROMPT:
            return self.prompt
        if unit is Unit.COMPLETION:
            return self.completion
        if unit is Unit.COST:
            return self.money
        return self.prompt + self.completion


@dataclass(frozen=True, slots=True)
class Who:
    """Whose limits apply: the tenant, the served model, the key's hash."""

    tenant: str
    model: str | None = None
    key: str | None = None


@dataclass(frozen=True, slots=True)
class Standing:
    """One limit as the x-ratelimit-* headers tell it."""

    limit: int
    remaining: int
    reset: float  # seconds until it is whole again


@dataclass(frozen=True, slots=True)
class LimitStanding:
    """One limit of one level as admission sees it now, nothing reserved: ``used`` is
    what its budget billed in the period (a rate: what its window has yet to refill; a
    gate: the requests in flight), ``held`` what requests in flight hold of a budget, and
    ``standing`` the headers' limit, remaining and reset."""

    scope: tuple[str, ...]  # ("tenant", t) | ("model", t, m) | ("key", t, key_hash)
    limit: Limit
    used: int
    held: int
    standing: Standing
    start: float | None = None  # a budget's period, Unix seconds
    end: float | None = None


class StandingUnknown(Exception):
    """The limiter cannot say how a tenant stands now (its shared store cannot answer)."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request is not admitted."""

    limit: str  # the limit's name, e.g. total_tokens_per_month
    scope: tuple[str, ...]
    wait: float  # seconds until it may fit (inf: it never fits, see ``alone``)
    cost: int
    amount: int
    budget: bool = False
    unavailable: bool = False  # the shared store cannot answer and the fail mode refuses
    why: str = ""  # what an unavailable refusal tells the client

    @property
    def alone(self) -> bool:
        """The request's cost alone exceeds the limit's whole capacity."""
        return self.wait == float("inf")

    @property
    def distant(self) -> bool:
        """A budget spent until a reset too far away for a client to wait for."""
        return self.budget and self.wait > DISTANT_SECONDS


@dataclass(slots=True)
class Ticket:
    """A reservation: the units taken from each meter, owned by one exchange until it is
    settled or released (either, once). ``id``: a shared store's reservation id (its ends
    are idempotent by it); empty in process."""

    who: Who
    cost: Cost
    taken: list[tuple[tuple[str, ...], str, Unit]] = field(default_factory=list)
    open: bool = True
    id: str = ""

    def end(self) -> bool:
        """Settled or released from now on; whether it was open until now."""
        was, self.open = self.open, False
        return was


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer to a reservation: a ticket, or a refusal; and the headers' standings."""

    ticket: Ticket | None
    refusal: Refusal | None
    requests: Standing | None
    tokens: Standing | None
    budgets: tuple[tuple[str, int], ...] = ()  # the tenant's budgets: units left
    cost: Standing | None = None  # the money budget with the least room (in billionths)


def decision_of(
    ticket: Ticket | None,
    refusal: Refusal | None,
    standings: Iterable[tuple[tuple[str, ...], Limit, Standing]],
) -> Decision:
    """The decision with the tightest request, token and money limit (the least
    remaining) of ``standings`` (each limit's, net of the reservations in flight), and
    what is left of the tenant's budgets."""
    tightest: dict[str, Standing] = {}
    budgets: list[tuple[str, int]] = []
    for scope, limit, standing in standings:
        if limit.window is None:
            continue
        if limit.budget and scope[0] == "tenant":
            budgets.append((limit.name, standing.remaining))
        kind = "tokens" if limit.tokens else "cost" if limit.money else "requests"
        held = tightest.get(kind)
        if held is None or standing.remaining < held.remaining:
            tightest[kind] = standing
    return Decision(
        ticket,
        refusal,
        tightest.get("requests"),
        tightest.get("tokens"),
        tuple(budgets),
        tightest.get("cost"),
    )


@dataclass(frozen=True, slots=True)
class Usage:
    """One journaled record, as budgets are rebuilt from it."""

    who: Who
    at: float  # Unix seconds
    cost: Cost


class Limiter(Protocol):
    """Admission's view of a limiter. ``now`` is Unix seconds (an implementation on a
    shared store may use the store's clock instead)."""

    policies: Policies
    # Whether its standings are a shared store's, the same on every replica (else this
    # replica's own).
    shared_store: bool

    async def reserve(self, who: Who, cost: Cost, now: float) -> Decision:
        """Reserve ``cost`` at every level that applies to ``who``, or nothing."""
        ...

    async def settle(self, ticket: Ticket, billed: Cost, now: float) -> None:
        """Replace the reservation by what the record bills."""
        ...

    async def release(self, ticket: Ticket, now: float) -> None:
        """Give the reservation back: nothing was billed."""
        ...

    async def restore(self, history: Iterable[Usage], now: float) -> int:
        """Rebuild the budgets' period usage from the journal; the records taken."""
        ...

    async def standing(self, tenant: str, now: float) -> list[LimitStanding]:
        """Every limit of ``tenant``'s levels (its own, its models', its keys') as the
        next reservation would find it; reads only (raises ``StandingUnknown``)."""
        ...

    def replace(self, policies: Policies) -> None:
        """Use new policies from the next reservation on (reservations held keep theirs)."""
        ...

    def wants_tokens(self, tenant: str) -> bool:
        """Whether a token limit may apply to ``tenant`` (its cost is then needed before
        forwarding)."""
        ...

    def problem(self) -> tuple[str, bool] | None:
        """What /readyz says of this limiter (a shared store's state), and whether it
        fails readiness; None: nothing to say."""
        ...

    def lifetime(self, *, journaled: bool) -> Lifetime:
        """What this limiter runs while the application serves (a shared store's
        heartbeat), closed after; ``journaled``: whether its usage is restored from a
        journal (``restore``) before it may contribute to a store."""
        ...
