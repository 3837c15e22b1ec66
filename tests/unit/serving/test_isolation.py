"""Tenants kept apart inside vLLM: response owners and cache salts (issue #44)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.accounting.routes import route_of
from proxy.ledger.journal import Journal
from proxy.serving.isolation import CacheSalts, ResponseOwners, stored_response_id


@given(st.text(), st.text(), st.text(), st.text() | st.none())
def test_no_tenant_can_choose_another_tenants_salt(
    tenant: str, other: str, client: str, other_client: str | None
) -> None:
    """A salt is a function of the tenant and the client's salt, and two different pairs
    never give one salt (the parts are length-prefixed: ("a", "bc") is not ("ab", "c"))."""
    salts = CacheSalts("k")
    assert salts.salt(tenant, client) == CacheSalts("k").salt(tenant, client)
    if (tenant, client) != (other, other_client or ""):
        assert salts.salt(tenant, client) != salts.salt(other, other_client)


def test_salts_are_keyed() -> None:
    """Without the deployment's key a salt cannot be computed from a tenant's name; unset,
    each process draws its own key."""
    assert CacheSalts("k1").salt("alice", None) != CacheSalts("k2").salt("alice", None)
    assert CacheSalts(None).salt("alice", None) != CacheSalts(None).salt("alice", None)


@pytest.mark.parametrize(
    ("path", "named"),
    [
        ("/v1/responses/resp_1", "resp_1"),
        ("/v1/responses/resp_1/cancel", "resp_1"),
        ("/v1/responses", None),
        ("/v1/responses/render", None),  # rendering a prompt, not a stored response
    ],
)
def test_stored_response_routes_name_their_id(path: str, named: str | None) -> None:
    """GET and cancel name the response; other routes under /v1/responses none (review:
    /v1/responses/render was answered 404 as a response nobody owned)."""
    route = route_of(path)
    assert route is not None
    assert stored_response_id(route, path) == named


async def test_owners_without_a_journal_are_kept_in_memory() -> None:
    """--journal off: owners are kept in memory; an unknown id is nobody's."""
    owners = ResponseOwners(None)
    minted = owners.mint()
    await owners.claim(minted, "alice")
    assert await owners.owner(minted) == "alice"
    assert await owners.refusal(minted, "alice") is None
    refusal = await owners.refusal(minted, "bob")
    assert refusal is not None
    assert refusal.status == 404
    assert (await owners.refusal("resp_unknown", "alice")) is not None


async def test_a_closed_journal_keeps_the_claim_in_memory(tmp_path: Path) -> None:
    """A claim the journal cannot take is kept in memory, so the tenant still owns its
    response in this process (never an unowned id another tenant could use)."""
    journal = Journal(tmp_path / "j.sqlite")
    await journal.open()
    await journal.close()
    owners = ResponseOwners(journal)
    await owners.claim("resp_x", "alice")
    assert await owners.owner("resp_x") == "alice"
