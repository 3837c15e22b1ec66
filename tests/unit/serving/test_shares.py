"""A tenant's share of upstream slots and of held body bytes: work-conserving, and the
last share always kept for the others."""

from __future__ import annotations

from proxy.metrics import Metrics
from proxy.serving.shares import TenantShares
from proxy.settings import Settings


def shares(enforced: bool = True) -> TenantShares:
    metrics = Metrics(Settings(upstream="http://x"))
    return TenantShares(8, 1000, 0.25, metrics, enforced=enforced)


def test_a_tenant_may_use_what_is_free_but_never_the_others_last_share() -> None:
    """Two slots is a quarter of 8: bob may take six while no one else holds any, never
    the last two; alice still gets hers, and a tenant within its share always does; a
    refusal is a 429 with Retry-After."""
    s = shares()
    for _ in range(6):
        assert s.enter("bob") is None
    refused = s.enter("bob")
    assert refused is not None
    assert (refused.status, refused.headers["Retry-After"]) == (429, "1")
    assert s.enter("alice") is None
    assert s.enter("alice") is None
    s.leave("bob")
    assert s.enter("bob") is not None  # the last share stays free for a third tenant
    assert s.enter("carol") is None  # within her share: always admitted


def test_a_lone_body_is_never_refused_for_the_share() -> None:
    """A tenant holding nothing may hold one body of any size (--max-body-bytes bounds
    it); past its share and into the others' last share, the next is refused."""
    s = shares()
    assert s.hold("bob", 900) is None
    assert s.hold("bob", 10) is not None
    assert s.hold("alice", 200) is None
    s.release("bob", 900)
    assert s.hold("bob", 200) is None


def test_with_one_tenant_or_a_whole_share_nothing_is_refused() -> None:
    """Without tenants told apart (everyone anonymous) or with --tenant-share 1, shares
    refuse nothing: the global bounds alone apply."""
    for s in (
        shares(enforced=False),
        TenantShares(8, 1000, 1.0, Metrics(Settings(upstream="http://x"))),
    ):
        assert all(s.enter("anonymous") is None for _ in range(20))
        assert s.hold("anonymous", 900) is None
        assert s.hold("anonymous", 900) is None
