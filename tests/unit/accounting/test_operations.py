"""The operations: one spelling each, the very strings records and logs always carried."""

from __future__ import annotations

import json

from proxy.accounting.fields import FIELDS
from proxy.accounting.operations import (
    AUDIO_OPERATIONS,
    CHOICES_OPERATIONS,
    GENERATION_OPERATIONS,
    POOLING_OPERATIONS,
    SCORING_OPERATIONS,
    Operation,
)
from proxy.accounting.routes import ROUTES, Handling


def test_every_operation_is_a_route_s_or_the_dispatcher_s() -> None:
    """Each member names some route of the table, or is what ``/invocations`` answers
    for a body that fits no endpoint: no member is spelled for nothing."""
    named = {route.operation for route in ROUTES}
    assert set(Operation) - named == {Operation.OTHER}


def test_a_member_is_its_wire_string() -> None:
    """A member equals, hashes, formats and serialises as its old bare string, so a
    record journaled before the enum reads back as the same operation."""
    for operation in Operation:
        assert operation == operation.value
        assert {operation.value: 1}[operation] == 1
        assert f"{operation}" == operation.value
        assert json.loads(json.dumps({"operation": operation})) == {"operation": operation.value}


def test_the_metered_operations_each_have_their_field_table() -> None:
    """Every operation an audited or metered route performs has its request fields
    classified, and no field table names an operation no such route performs."""
    billed = {r.operation for r in ROUTES if r.handling in (Handling.AUDITED, Handling.METERED)}
    assert billed == set(FIELDS)


def test_the_classes_of_operations_are_billed_ones() -> None:
    """The operation classes the limits and the windows read hold billed operations
    only, and a generation is never also pooling, scoring or audio."""
    billed = set(FIELDS)
    classes = (
        AUDIO_OPERATIONS,
        CHOICES_OPERATIONS,
        GENERATION_OPERATIONS,
        POOLING_OPERATIONS,
        SCORING_OPERATIONS,
    )
    assert all(group <= billed for group in classes)
    assert not GENERATION_OPERATIONS & (POOLING_OPERATIONS | SCORING_OPERATIONS | AUDIO_OPERATIONS)
