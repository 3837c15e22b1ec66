"""The limits file: the issue's example validates, names are a closed set, levels apply
as documented (an own entry replaces the default; model and key entries narrow it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from proxy.limits.policy import Limit, Policies, Unit, Window, load_policies

EXAMPLE = """
timezone: Europe/Paris          # budget periods reset at local midnight / first of the month
default:                        # applies to every tenant without an entry of its own
  requests_per_minute: 600
tenants:
  acme:
    prompt_tokens_per_minute: 200000
    total_tokens_per_month: 50000000
    concurrency: 16
    models:                     # narrower limits for one model, within the tenant's
      bge-reranker: {prompt_tokens_per_minute: 20000}
"""


def test_the_issue_example_is_the_contract(tmp_path: Path) -> None:
    """The file shape of the issue loads as written, with every limit it names."""
    path = tmp_path / "limits.yaml"
    path.write_text(EXAMPLE)
    policies = load_policies(path)
    assert policies.timezone == "Europe/Paris"
    acme = policies.tenants["acme"]
    assert set(acme.limits()) == {
        Limit(Unit.PROMPT, Window.MINUTE, 200000),
        Limit(Unit.TOTAL, Window.MONTH, 50000000),
        Limit(Unit.REQUESTS, None, 16),
    }
    assert acme.models["bge-reranker"].limits() == (Limit(Unit.PROMPT, Window.MINUTE, 20000),)


@pytest.mark.parametrize(
    "bad",
    [
        {"tenants": {"acme": {"requests_per_fortnight": 1}}},
        {"tenants": {"acme": {"tokens_per_minute": 1}}},
        {"default": {"requests_per_minute": 0}},
        {"default": {"requests_per_minute": -5}},
        {"timezone": "Mars/Olympus"},
        {"tenant": {}},
    ],
)
def test_a_wrong_file_is_refused_whole(bad: dict[str, object]) -> None:
    """A misspelt limit, a non-positive amount, an unknown zone or member fails."""
    with pytest.raises(ValidationError):
        Policies.model_validate(bad)


def test_levels_that_apply() -> None:
    """A tenant with an entry gets its own limits (not the default's), narrowed by its
    model's and key's; any other tenant gets the default, in a scope of its own."""
    policies = Policies.model_validate(
        {
            "default": {"requests_per_minute": 10},
            "tenants": {
                "acme": {
                    "requests_per_second": 5,
                    "models": {"m": {"prompt_tokens_per_hour": 7}},
                    "keys": {"k1": {"concurrency": 2}},
                }
            },
        }
    )
    scopes = [level.scope for level in policies.levels("acme", "m", "k1")]
    assert scopes == [("tenant", "acme"), ("model", "acme", "m"), ("key", "acme", "k1")]
    assert [level.scope for level in policies.levels("acme", "other", None)] == [("tenant", "acme")]
    (other,) = policies.levels("bob", "m", None)
    assert other.scope == ("tenant", "bob")
    assert other.limits == (Limit(Unit.REQUESTS, Window.MINUTE, 10),)
    assert policies.wants_tokens("acme")
    assert not policies.wants_tokens("bob")
    assert Policies().levels("bob", None, None) == ()
