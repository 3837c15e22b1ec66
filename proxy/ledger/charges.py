"""The report's amounts: every record re-priced from the price table at its own time (a
corrected price file re-prices history exactly: records carry units, never amounts), per
tenant, model, unit and price in force; each tenant's amount rounded once, to what its
invoice states (``money.due``: the currency's minor unit, half to even).

A record is unpriced when no price of its model is in force at its time or a unit it
holds has no price: it is counted, and left out of the amounts (never priced at zero).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from proxy.accounting.money import EXACT, plain
from proxy.accounting.prices import PriceTable
from proxy.accounting.units import Quantities, Unit
from proxy.ledger.records import UsageRecord

ZERO = Decimal(0)
# JSON carries money as strings written in full (``money.plain``): no float in between.


@dataclass(frozen=True, slots=True)
class ChargeLine:
    """One unit of one model for one tenant at one price: quantity times price."""

    tenant: str
    model: str
    unit: Unit
    since: datetime | None  # when that price came into force (None: always before)
    price: Decimal
    quantity: int
    amount: Decimal  # exact

    def as_dict(self) -> dict[str, object]:
        return {
            "tenant": self.tenant,
            "model": self.model,
            "unit": self.unit.value,
            "price_since": self.since.isoformat() if self.since else None,
            "price": plain(self.price),
            "quantity": self.quantity,
            "amount": plain(self.amount),
        }


@dataclass(slots=True)
class Amounts:
    """Exact amounts per unit of some records, and how many could not be priced."""

    units: dict[Unit, Decimal] = field(default_factory=dict)
    unpriced: int = 0

    @property
    def total(self) -> Decimal:
        return sum(self.units.values(), ZERO)

    def add(self, unit: Unit, amount: Decimal) -> None:
        self.units[unit] = EXACT.add(self.units.get(unit, ZERO), amount)


@dataclass(frozen=True, slots=True)
class TenantCharge:
    tenant: str
    amount: Decimal  # exact
    due: Decimal  # rounded once
    unpriced: int

    def as_dict(self) -> dict[str, object]:
        return {
            "tenant": self.tenant,
            "amount": plain(self.amount),
            "due": str(self.due),
            "unpriced_requests": self.unpriced,
        }


@dataclass
class Charges:
    currency: str
    decimals: int
    lines: list[ChargeLine]
    tenants: list[TenantCharge]
    rows: dict[tuple[str, ...], Amounts]  # by the report's row keys

    @property
    def due(self) -> Decimal:
        """What the invoices state together: the sum of each tenant's rounded amount."""
        return sum((t.due for t in self.tenants), Decimal(0).scaleb(-self.decimals))

    @property
    def unpriced(self) -> int:
        return sum(t.unpriced for t in self.tenants)

    def tenant(self, name: str) -> TenantCharge | None:
        return next((t for t in self.tenants if t.tenant == name), None)

    def as_dict(self) -> dict[str, object]:
        return {
            "currency": self.currency,
            "rounding": f"each tenant's amount, once, to {self.decimals} decimal places, "
            "half to even",
            "lines": [line.as_dict() for line in self.lines],
            "tenants": [t.as_dict() for t in self.tenants],
            "due": str(self.due),
            "unpriced_requests": self.unpriced,
        }


LineKey = tuple[str, str, Unit, datetime | None, Decimal]


def charge(
    records: Iterable[UsageRecord],
    table: PriceTable,
    row_of: Callable[[UsageRecord], tuple[str, ...]],
) -> Charges:
    """Price every record at its time; ``row_of`` names the report row it belongs to."""
    lines: dict[LineKey, list[int | Decimal]] = {}
    tenants: dict[str, Amounts] = {}
    rows: dict[tuple[str, ...], Amounts] = {}
    for r in records:
        mine = tenants.setdefault(r.tenant, Amounts())
        row = rows.setdefault(row_of(r), Amounts())
        q = r.units.quantities()
        if q == Quantities():
            continue  # billed nothing (an invalid answer): nothing to price
        rate = table.rate(r.model, r.time)
        priced = rate.lines(q) if rate is not None else None
        if rate is None or priced is None:
            mine.unpriced += 1
            row.unpriced += 1
            continue
        for line in priced:
            key = (r.tenant, r.model or "-", line.unit, rate.start, line.price)
            held = lines.setdefault(key, [0, ZERO])
            held[0] = int(held[0]) + line.quantity
            held[1] = EXACT.add(held[1], line.amount)
            mine.add(line.unit, line.amount)
            row.add(line.unit, line.amount)
    units = list(Unit)
    ordered = sorted(
        lines.items(),
        key=lambda kv: (kv[0][0], kv[0][1], units.index(kv[0][2]), kv[0][3] is not None, kv[0][3]),
    )
    return Charges(
        table.currency,
        table.decimals,
        [ChargeLine(*key, int(q), Decimal(a)) for key, (q, a) in ordered],
        [
            TenantCharge(name, a.total, table.due(a.total), a.unpriced)
            for name, a in sorted(tenants.items())
        ],
        rows,
    )
