"""The seam's data: what a cost is in each unit, when a refusal is final."""

from __future__ import annotations

import math

from proxy.limits.limiter import DISTANT_SECONDS, Cost, Refusal
from proxy.limits.policy import Unit


def test_cost_in_each_unit() -> None:
    """Total is prompt plus completion (never money); a request is one request; cost is
    its money in billionths."""
    cost = Cost(7, 5, money=450)
    assert [cost.of(u) for u in Unit] == [1, 7, 5, 12, 450]


def test_when_a_refusal_is_final() -> None:
    """Alone: the cost never fits; distant: a budget reset too far to wait for (a rate's
    wait is never distant, however long)."""
    scope = ("tenant", "a")
    assert Refusal("x", scope, math.inf, 1, 1).alone
    assert Refusal("x", scope, DISTANT_SECONDS + 1, 1, 1, budget=True).distant
    assert not Refusal("x", scope, DISTANT_SECONDS + 1, 1, 1).distant
    assert not Refusal("x", scope, DISTANT_SECONDS, 1, 1, budget=True).distant
