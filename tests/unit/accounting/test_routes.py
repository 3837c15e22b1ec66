"""The route table: one route per path, and every reader of it agrees with it."""

from __future__ import annotations

import pytest

from proxy.accounting.routes import BY_PATH, ROUTES, Handling, operation_of
from proxy.accounting.shapes import endpoint_for_path

AUDITED = [route for route in ROUTES if route.handling is Handling.AUDITED]
NOT_METERED = [
    route.path
    for route in ROUTES
    if route.path in BY_PATH and route.handling not in (Handling.AUDITED, Handling.METERED)
]


def test_no_path_is_in_the_table_twice() -> None:
    """Each path has one route: the lookup by path finds the very route the table lists,
    so no later entry silently overrides an earlier one."""
    paths = [route.path for route in ROUTES]
    assert len(paths) == len(set(paths))
    assert all(BY_PATH[route.path] is route for route in ROUTES if route.path in BY_PATH)


@pytest.mark.parametrize("route", AUDITED, ids=lambda route: route.path)
def test_every_audited_path_parses_as_score_or_rerank(route: object) -> None:
    """The request parser reads an audited path as the scoring shape the table names."""
    assert route.operation in ("score", "rerank")  # type: ignore[attr-defined]
    assert endpoint_for_path(route.path) == route.operation  # type: ignore[attr-defined]


def test_audited_and_metered_paths_name_their_operation() -> None:
    """A direct POST to an audited or metered path is recorded under its route's operation."""
    metered = [r for r in ROUTES if r.handling in (Handling.AUDITED, Handling.METERED)]
    assert metered
    for route in metered:
        if route.path in BY_PATH:
            assert operation_of(route.path) == route.operation


@pytest.mark.parametrize("path", [*NOT_METERED, "/not/a/route", "/v1/rerank/", ""])
def test_a_path_that_is_not_metered_has_no_operation(path: str) -> None:
    """Probes, /invocations (its body decides) and unknown paths have no direct operation."""
    assert operation_of(path) is None
