"""What the shared limiter and the store say to each other: a reservation in the store
(``StoreTicket``) and the parts it takes (``Taken``: one level's limit with its keys), a
contribution's answer (``Synced``), a heartbeat's (``Beat``), the refusal to reserve on a
store being rebuilt (``Rebuilding``), and how long the store keeps what it is told."""

from __future__ import annotations

from dataclasses import dataclass, field

from proxy.limits.limiter import Ticket
from proxy.limits.policy import Limit, Unit

# A budget's hash outlives its period by this much: a late settlement still lands.
BUDGET_GRACE_SECONDS = 86_400
# How long a settled or released id is remembered (a retry within it changes nothing).
DONE_SECONDS = 86_400
# The generation marker outlives every budget hash (a month and its grace), refreshed by
# each contribution and heartbeat: while it lives, the budgets in the store are whole.
GENERATION_SECONDS = 40 * 86_400


class Rebuilding(Exception):
    """The store's budgets are being rebuilt (a store found empty): no reservation is
    made on it until every replica has contributed its journal."""

    def __init__(self, contributed: bool) -> None:
        super().__init__("the limits store's budgets are being rebuilt")
        self.contributed = contributed  # whether this replica has already


@dataclass(frozen=True, slots=True)
class Synced:
    """What a contribution found: the store's generation, whether it is complete, and
    whether this contribution started it (the store was empty: a rebuild)."""

    generation: str
    complete: bool
    created: bool
    budgets: int  # budget hashes this replica wrote its total to


@dataclass(frozen=True, slots=True)
class Beat:
    """What a heartbeat read: the live replicas, how long this one has stayed in the
    registry, the store's time, and this replica's view of the generation marker."""

    count: int
    stayed: float  # seconds since this replica's current stay in the registry began
    now: float  # the store's clock
    generation: str | None
    contributed: bool  # whether this replica has contributed to that generation
    complete: bool


@dataclass(frozen=True, slots=True)
class Taken:
    """One level's part of a reservation in the store."""

    scope: tuple[str, ...]
    limit: Limit
    key: str
    holds: str
    kind: str  # r (rate), b (budget), g (gate)
    span: float  # a rate's window; a budget's period end (Unix seconds)
    start: float  # a budget's period start


@dataclass(slots=True)
class StoreTicket(Ticket):
    """A reservation in the store: the keys it took from."""

    parts: list[Taken] = field(default_factory=list)
    noted: bool = False  # its billed units are in this replica's history
    generation: str | None = None  # the store's generation it was reserved in

    def reserved_in(self, generation: str | None) -> None:
        """Admitted by the store (or its holds taken again) in ``generation``."""
        self.generation = generation
        self.taken = [(p.scope, p.limit.name, p.limit.unit) for p in self.parts]

    def note(self) -> bool:
        """Its settlement goes into this replica's history; whether for the first time."""
        first, self.noted = not self.noted, True
        return first


@dataclass(slots=True)
class Left:
    """What the store said was used and reserved of a budget's period (ending at ``end``)
    when it last said so (``at``, on the store's clock: answers read out of order do not
    replace a later one), after this replica's local admissions up to ``seq``: what is left
    is the amount in force less that (a reload that lowers a budget in an outage lowers
    it); ``spent``: what this replica admitted without the store since (held, then
    billed)."""

    consumed: int
    at: float
    seq: int
    end: float
    spent: int = 0

    def spend(self, units: int) -> None:
        """Admitted (or billed, or given back: negative) without the store since."""
        self.spent += units


Charge = tuple[str, Left, Unit, int]  # a budget key, its remainder, the unit and the units


@dataclass(slots=True)
class LocalTicket(Ticket):
    """A reservation made in this process while the store could not answer (``local`` or
    ``open``). Its holds at the budgets and gates of ``parts`` are taken in the store by
    this replica's next contribution (``adopting``, then ``adopted`` once the store
    confirmed), renewed while it runs and given back by its end; its bill is this
    replica's part from then on. ``charged``: the remainders it counts in, by budget key
    (with its units there)."""

    inner: Ticket | None = None
    seq: int = 0
    parts: list[Taken] = field(default_factory=list)
    adopting: bool = False
    adopted: bool = False
    charged: list[tuple[str, Left, Unit, int]] = field(default_factory=list)

    def held(
        self, seq: int, charged: list[tuple[str, Left, Unit, int]], parts: list[Taken]
    ) -> None:
        """Admitted without the store as local admission ``seq``: what it counts in."""
        self.seq, self.charged, self.parts = seq, charged, parts

    def adopt(self) -> None:
        """Its holds are sent to the store (a contribution); its end gives them back."""
        self.adopting = True

    def confirm(self) -> None:
        """The store took its holds: renewed while it runs."""
        self.adopted = self.open
