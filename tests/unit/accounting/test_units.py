"""The units: one spelling, which every structure that holds a count per unit follows."""

from __future__ import annotations

from dataclasses import fields

import pytest

from proxy.accounting.price_schedule import Version
from proxy.accounting.units import Quantities, Unit, units_named
from proxy.ledger.records import Units

NAMES = {unit.value for unit in Unit}


def test_every_holder_of_units_holds_exactly_the_units() -> None:
    """A record's units, a priced quantity and a price file's version hold one field per
    unit, named as the unit: a unit added to one and not the others fails here."""
    assert {f.name for f in fields(Quantities)} == NAMES
    assert set(Units.model_fields) == NAMES
    assert set(Version.model_fields) - {"start", "until"} == NAMES


@pytest.mark.parametrize("unit", list(Unit))
def test_a_quantity_is_read_by_its_unit(unit: Unit) -> None:
    """``Quantities.of`` reads the count of the unit asked for, and no other."""
    held = Quantities(**{unit.value: 7})
    assert held.of(unit) == 7
    assert all(held.of(other) == 0 for other in Unit if other is not unit)


def test_the_units_are_named_in_their_order() -> None:
    """The sentence a help text lists the units in follows the enum's order."""
    assert units_named() == "prompt_tokens, cached_prompt_tokens, completion_tokens, audio_seconds"
