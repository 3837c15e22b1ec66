"""Prices in force: what each unit a record carries costs, per served model (and a
default for the others), from when (``price_schedule`` reads them from the ``--prices`` file).
A record is priced at the price in force at its time; amounts are exact Decimals,
rounded once per invoice (``money.due``)."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from itertools import pairwise

from proxy.accounting.money import EXACT, due, nanos_up
from proxy.accounting.units import Quantities, Unit


@dataclass(frozen=True, slots=True)
class Line:
    """One unit of a priced quantity: how many, at what price, the exact amount."""

    unit: Unit
    quantity: int
    price: Decimal
    amount: Decimal


@dataclass(frozen=True, slots=True)
class Rate:
    """One price of one model (or of the default), in force from ``start`` (inclusive;
    None: always before) to ``end`` (exclusive; None: for ever)."""

    start: datetime | None
    end: datetime | None
    prices: tuple[tuple[Unit, Decimal], ...]

    def price(self, unit: Unit) -> Decimal | None:
        return next((p for u, p in self.prices if u is unit), None)

    def covers(self, at: datetime) -> bool:
        return (self.start is None or self.start <= at) and (self.end is None or at < self.end)

    def lines(self, q: Quantities, *, strict: bool = True) -> tuple[Line, ...] | None:
        """The exact amount of each unit ``q`` holds; None when a unit it holds has no
        price here (not ``strict``: those units are left out). Cached prompt tokens are
        priced at their own price when there is one (the prompt line then holds the
        others), else as any prompt token."""
        cached_price = self.price(Unit.CACHED)
        cached = min(q.cached_prompt_tokens, q.prompt_tokens) if cached_price is not None else 0
        wanted = (
            (Unit.PROMPT, q.prompt_tokens - cached),
            (Unit.CACHED, cached),
            (Unit.COMPLETION, q.completion_tokens),
            (Unit.AUDIO, q.audio_seconds),
        )
        out = []
        for unit, quantity in wanted:
            if quantity == 0:
                continue
            price = self.price(unit)
            if price is None and strict:
                return None
            if price is None:
                continue
            out.append(Line(unit, quantity, price, EXACT.multiply(Decimal(quantity), price)))
        return tuple(out)

    def most(self, q: Quantities) -> Decimal | None:
        """The dearest ``q`` can cost here: each prompt token at the dearer of the prompt
        and the cached price (which of them the engine's cache serves is known only
        after); None when a unit it holds has no price here (a prompt token needs the
        prompt price: the cached one covers only the tokens the cache serves)."""
        prompt = self.price(Unit.PROMPT)
        cached = self.price(Unit.CACHED)
        wanted = (
            (q.prompt_tokens, prompt if prompt is None or cached is None else max(prompt, cached)),
            (q.completion_tokens, self.price(Unit.COMPLETION)),
            (q.audio_seconds, self.price(Unit.AUDIO)),
        )
        total = Decimal(0)
        for quantity, price in wanted:
            if quantity == 0:
                continue
            if price is None:
                return None
            total = EXACT.add(total, EXACT.multiply(Decimal(quantity), price))
        return total

    def unpriced(self, q: Quantities) -> list[Unit]:
        """The units ``q`` holds that have no price here."""
        held = (
            (Unit.PROMPT, q.prompt_tokens),
            (Unit.COMPLETION, q.completion_tokens),
            (Unit.AUDIO, q.audio_seconds),
        )
        return [unit for unit, quantity in held if quantity and self.price(unit) is None]


@dataclass(frozen=True, slots=True)
class PriceTable:
    """The prices in use: each model's rates in time order (``None``: the default's, for
    every model without its own)."""

    currency: str
    decimals: int
    rates: Mapping[str | None, tuple[Rate, ...]]

    def rate(self, model: str | None, at: datetime) -> Rate | None:
        """The rate in force for ``model`` at ``at``: the model's own when it has any (a
        time none of them covers has none), else the default's."""
        rates = self.rates.get(model) if model is not None else None
        if rates is None:
            rates = self.rates.get(None, ())
        starts = [r.start.timestamp() if r.start else float("-inf") for r in rates]
        i = bisect_right(starts, at.timestamp()) - 1
        if i >= 0 and rates[i].covers(at):
            return rates[i]
        return None

    def over(self, model: str | None, start: datetime, end: datetime) -> list[Rate] | None:
        """Every rate in force for ``model`` at some instant from ``start`` to ``end``
        (both included), in time order; None when some instant of it has none (a gap
        between two prices, or after the last)."""
        found: list[Rate] = []
        at = start
        while True:
            rate = self.rate(model, at)
            if rate is None:
                return None
            found.append(rate)
            if rate.end is None or rate.end > end:
                return found
            at = rate.end

    def gap(self, model: str | None, after: datetime) -> tuple[datetime, datetime] | None:
        """The first stretch after ``after`` when ``model`` has no price although a later
        price of it starts (one price's ``until`` before the next one's ``from``): its
        start and end; None when there is none (after the last price is no gap)."""
        rates = self.rates.get(model) if model is not None else None
        if rates is None:
            rates = self.rates.get(None, ())
        for one, following in pairwise(rates):
            if one.end is None or following.start is None or following.start <= one.end:
                continue
            if following.start > after:
                return one.end, following.start
        return None

    def cuts(self) -> list[datetime]:
        """Every instant at which some rate starts or ends, in order: between two of them
        no model's price changes."""
        found = {m for rates in self.rates.values() for r in rates for m in (r.start, r.end)}
        return sorted(m for m in found if m is not None)

    def models(self) -> Iterable[str]:
        return (m for m in self.rates if m is not None)

    def nanos(self, model: str | None, q: Quantities, at: datetime) -> int | None:
        """What a record costs a limiter (in billionths, rounded up), or None when no
        rate is in force or a unit it holds has no price."""
        rate = self.rate(model, at)
        lines = rate.lines(q) if rate is not None else None
        if lines is None:
            return None
        return nanos_up(sum((line.amount for line in lines), Decimal(0)))

    def due(self, amount: Decimal) -> Decimal:
        """``amount`` as an invoice states it (the one rounding, ``money.due``)."""
        return due(amount, self.decimals)
