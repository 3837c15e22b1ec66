"""Money as the proxy writes and counts it: amounts in ``decimal.Decimal`` (never a float),
exact until an invoice rounds them once; the integer billionths a limiter counts; YAML
read so that a number is the decimal it was written as (docs/metering.md, "Prices")."""

from __future__ import annotations

from decimal import (
    ROUND_CEILING,
    ROUND_HALF_EVEN,
    Context,
    Decimal,
    DivisionByZero,
    Inexact,
    InvalidOperation,
    Overflow,
)
from typing import Annotated, Any

import yaml
from pydantic import PlainValidator

# Exact arithmetic: digits enough for any count times any price; an inexact result raises.
EXACT = Context(prec=80, traps=[Inexact, InvalidOperation, Overflow, DivisionByZero])
# The one rounding of an invoice: to the currency's minor unit, half to even.
ROUNDING = Context(prec=80, rounding=ROUND_HALF_EVEN, traps=[InvalidOperation, Overflow])
# Limiters count money in billionths of the currency unit ("nanos"): integers, as the
# shared store's Lua counts (doubles, exact up to 2**53 nanos, about 9 million units).
NANOS = 10**9
# A budget must stay well inside that: room for the reservations in flight beside it.
MOST_BUDGET = Decimal(4_000_000)
# A price has at most this many decimal places and significant digits.
MOST_PLACES = 24
MOST_DIGITS = 30

# ISO 4217 currencies whose minor unit is not a hundredth.
ZERO_DECIMALS = frozenset(
    {"BIF", "CLP", "DJF", "GNF", "ISK", "JPY", "KMF", "KRW", "PYG", "RWF", "UGX", "UYI"}
    | {"VND", "VUV", "XAF", "XOF", "XPF"}
)
THREE_DECIMALS = frozenset(("BHD", "IQD", "JOD", "KWD", "LYD", "OMR", "TND"))


def amount(value: object) -> Decimal:
    """A price or a budget as written: a decimal string, an integer, or a YAML number read
    by ``read_yaml`` (a Decimal); never a float, a bool, NaN, infinity or below zero."""
    if isinstance(value, bool | float):
        raise ValueError(f"{value!r} is a float: write money as a decimal string, e.g. '0.0000002'")
    if isinstance(value, int | Decimal):
        found = Decimal(value)
    elif isinstance(value, str):
        try:
            found = Decimal(value.strip())
        except InvalidOperation:
            raise ValueError(f"{value!r} is not a number") from None
    else:
        raise ValueError(f"{value!r} is not a number")
    if not found.is_finite():
        raise ValueError(f"{str(value)!r} is not a finite number")
    if found < 0:
        raise ValueError(f"{value} is negative")
    digits = found.as_tuple()
    places = -digits.exponent if isinstance(digits.exponent, int) else 0
    if places > MOST_PLACES or len(digits.digits) > MOST_DIGITS:
        raise ValueError(
            f"{value} has more than {MOST_PLACES} decimal places or {MOST_DIGITS} digits"
        )
    return found.copy_abs()  # -0 is 0


Amount = Annotated[Decimal, PlainValidator(amount)]


def nanos_up(value: Decimal) -> int:
    """``value`` in billionths of its unit, rounded up (a limiter never counts less than
    was spent)."""
    scaled = EXACT.multiply(value, Decimal(NANOS))
    return int(scaled.to_integral_value(rounding=ROUND_CEILING))


def from_nanos(nanos: int) -> Decimal:
    return Decimal(nanos).scaleb(-9, EXACT)


def plain(value: Decimal) -> str:
    """``value`` written out in full, without an exponent or trailing zeros: ``0.00000045``,
    ``250``, ``1.5``."""
    text = f"{value:f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text or "0"


def decimals_of(currency: str) -> int:
    """The digits of ``currency``'s minor unit (ISO 4217): 2, or 0 (JPY), or 3 (KWD)."""
    if currency in ZERO_DECIMALS:
        return 0
    return 3 if currency in THREE_DECIMALS else 2


def due(value: Decimal, decimals: int) -> Decimal:
    """The rounding rule, applied once per invoice: ``value`` to ``decimals`` places,
    half to even (banker's rounding)."""
    return value.quantize(Decimal(1).scaleb(-decimals), context=ROUNDING)


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping that names one key twice: YAML would keep the later silently."""

    def __init__(self, key: object, first: yaml.Mark, again: yaml.Mark) -> None:
        self.key = key
        self.lines = (first.line + 1, again.line + 1)
        problem = f"{key!r} is given twice, at lines {self.lines[0]} and {self.lines[1]}"
        super().__init__(None, None, problem, again)

    def said(self) -> str:
        """The problem in one sentence, with why it is one."""
        return f"{self.problem}: a name may appear once only (YAML would silently keep the later)"


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping that names a key twice (an operator's
    tenant listed twice must not have its first block silently dropped)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[object, yaml.Mark] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark)
            except TypeError:  # an unhashable key: PyYAML's own error says so
                continue
            if first is not key_node.start_mark:
                self.given_twice(DuplicateKeyError(key, first, key_node.start_mark))
        return super().construct_mapping(node, deep=deep)

    def given_twice(self, problem: DuplicateKeyError) -> None:
        """A key given twice: refused here; a loader that notes it keeps reading."""
        raise problem


class _DecimalLoader(UniqueKeyLoader):
    """PyYAML's safe loader, but a number with a fraction or an exponent is the Decimal
    written, not a float (``0.1`` is exactly one tenth; ``3e-08`` is a string to PyYAML's
    YAML 1.1 rules either way, and ``amount`` reads it)."""


def _decimal(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Decimal | str:
    text = str(loader.construct_scalar(node)).replace("_", "")
    try:
        return Decimal(text)
    except InvalidOperation:  # .inf, .nan, sexagesimal: no amount; validation says so
        return text


_DecimalLoader.add_constructor("tag:yaml.org,2002:float", _decimal)


def read_yaml(text: str) -> Any:
    """A YAML (or JSON) document whose fractional numbers are Decimals; a key given twice
    in one mapping is refused (``DuplicateKeyError``)."""
    return yaml.load(text, Loader=_DecimalLoader)  # a SafeLoader subclass


class _NotingLoader(_DecimalLoader):
    """``_DecimalLoader`` that notes each key given twice and keeps the later, as YAML
    does, so a file's other problems can be said in the same pass."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.twice: list[DuplicateKeyError] = []

    def given_twice(self, problem: DuplicateKeyError) -> None:
        self.twice.append(problem)


def read_yaml_noting(text: str) -> tuple[Any, list[DuplicateKeyError]]:
    """``read_yaml``'s document and every key given twice in it (the later kept): for a
    reader that says every problem of a file at once, the keys given twice among them."""
    loader = _NotingLoader(text)
    try:
        return loader.get_single_data(), loader.twice
    finally:
        loader.dispose()
