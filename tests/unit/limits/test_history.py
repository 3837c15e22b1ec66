"""The usage history: quarter-hour buckets, each level's requests where they count, and
pruning of what no period can read any more."""

from __future__ import annotations

import pytest

from proxy.limits.history import BUCKET_SECONDS, History, bucket_of, matches
from proxy.limits.limiter import Cost, Who
from proxy.limits.policy import Unit

ACME = Who("acme", "m", "k1")


@pytest.mark.parametrize(
    ("scope", "who", "counts"),
    [
        (("tenant", "acme"), ACME, True),
        (("tenant", "other"), ACME, False),
        (("model", "acme", "m"), ACME, True),
        (("model", "acme", "n"), ACME, False),
        (("key", "acme", "k1"), ACME, True),
        (("key", "acme", "k2"), Who("acme", "m", None), False),
    ],
)
def test_a_request_counts_at_its_own_levels(scope: tuple[str, ...], who: Who, counts: bool) -> None:
    """A tenant's level holds all its requests; a model's or a key's only their own."""
    assert matches(scope, who) is counts


def test_usage_is_summed_per_level_and_bucket() -> None:
    """Units land in the quarter hour of their time and are read by scope and unit."""
    book = History()
    book.note(ACME, Cost(10, 5, 1, 7), 1000.0)
    book.note(Who("acme", "n"), Cost(1, 0), 1000.0)
    assert bucket_of(1000.0) == BUCKET_SECONDS
    assert book.used(("tenant", "acme"), Unit.PROMPT, 0, 2 * BUCKET_SECONDS) == 11
    assert book.used(("model", "acme", "m"), Unit.TOTAL, 0, 2 * BUCKET_SECONDS) == 15
    assert book.used(("model", "acme", "m"), Unit.COST, 0, 2 * BUCKET_SECONDS) == 7
    assert book.used(("tenant", "acme"), Unit.PROMPT, 2 * BUCKET_SECONDS, 10**9) == 0


def test_pruning_forgets_old_buckets_and_empty_rows() -> None:
    """What is older than ``before`` goes, and a tenant left without rows goes with it."""
    book = History()
    book.note(ACME, Cost(3, 0), 0.0)
    book.note(Who("beta"), Cost(4, 0), 5 * BUCKET_SECONDS)
    book.prune(BUCKET_SECONDS)
    assert book.whos() == [Who("beta")]
