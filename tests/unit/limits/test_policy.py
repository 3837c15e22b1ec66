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


WANTING = {
    "tenants": {
        "tokens": {"prompt_tokens_per_day": 10},
        "money": {"cost_per_month": "5"},
        "requests": {"requests_per_minute": 10, "concurrency": 2},
        "model": {"requests_per_minute": 10, "models": {"m": {"total_tokens_per_hour": 5}}},
        "key": {"keys": {"ABCDEF0123456789": {"completion_tokens_per_minute": 5}}},
        "nothing": {},
    }
}


@pytest.mark.parametrize(
    "default", [None, {"requests_per_second": 5}, {"prompt_tokens_per_day": 9}]
)
@pytest.mark.parametrize(
    ("tenant", "wants"),
    [
        ("tokens", True),
        ("money", True),
        ("requests", False),
        ("model", True),  # a model's token limit applies to some of its requests
        ("key", True),
        ("nothing", False),  # a tenant named with no limit: not the default's
        ("stranger", None),  # not named: the default's
    ],
)
def test_which_tenants_want_a_count_before_forwarding(
    default: dict[str, int] | None, tenant: str, wants: bool | None
) -> None:
    """A tenant wants its request counted before forwarding when any token or money limit
    may apply to it, at any of its levels; a tenant not named, when the default's does.
    Asked again (the answer is read once per policies), the same."""
    policies = Policies.model_validate({**WANTING, "default": default})
    expected = wants if wants is not None else default == {"prompt_tokens_per_day": 9}
    assert [policies.wants_tokens(tenant) for _ in range(2)] == [expected, expected]


def test_a_money_budget_is_whole_billionths() -> None:
    """``cost_per_month: "250.00"`` (or an unquoted 250.00, read as that decimal) is a
    budget of 250e9 billionths; every other kind of money limit is refused."""
    policies = Policies.model_validate({"tenants": {"acme": {"cost_per_month": "250.00"}}})
    assert policies.tenants["acme"].limits() == (Limit(Unit.COST, Window.MONTH, 250 * 10**9),)
    assert policies.wants_tokens("acme")  # its price needs the request's count


def test_an_unquoted_money_budget_is_the_decimal_written(tmp_path: Path) -> None:
    """YAML's 0.1 is one tenth, not the float nearest it."""
    path = tmp_path / "limits.yaml"
    path.write_text("default: {cost_per_day: 0.1}\n")
    assert load_policies(path).default is not None
    assert load_policies(path).default.limits()[0].amount == 10**8  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("limit", "why"),
    [
        ({"cost_per_minute": "1"}, "calendar period"),
        ({"cost_per_month": "0"}, "not above zero"),
        ({"cost_per_month": "-5"}, "negative"),
        ({"cost_per_month": "0.0000000001"}, "9 decimal places"),
        ({"cost_per_month": "5000000"}, "the most a budget may be"),
        ({"cost_per_month": 0.5}, "float"),
        ({"cost_per_month": "lots"}, "not a number"),
    ],
)
def test_a_wrong_money_budget_is_refused(limit: dict[str, object], why: str) -> None:
    """A money rate, a budget not above zero, finer than a billionth, beyond what the
    store counts exactly, a float or no number."""
    with pytest.raises(ValidationError, match=why):
        Policies.model_validate({"default": limit})


def test_money_budgets_are_divided_in_whole_billionths() -> None:
    """A replica's share of a money budget (local fail mode) is rounded down."""
    policies = Policies.model_validate({"default": {"cost_per_day": "1.000000001"}})
    divided = policies.divided(3).default
    assert divided is not None
    assert divided.limits()[0].amount == 1_000_000_001 // 3


def test_which_models_a_money_budget_applies_to() -> None:
    """A tenant's, a key's or the default's budget applies to every model; a model's to
    that model."""
    named = Policies.model_validate(
        {"tenants": {"a": {"models": {"m": {"cost_per_day": "1"}, "n": {"concurrency": 1}}}}}
    )
    assert named.budgeted_models() == (False, frozenset({"m"}))
    assert named.money_applies("a", "m", None)
    assert not named.money_applies("a", "n", None)
    keyed = Policies.model_validate({"tenants": {"a": {"keys": {"k": {"cost_per_day": "1"}}}}})
    assert keyed.budgeted_models() == (True, frozenset())
    none = Policies.model_validate({"default": {"total_tokens_per_day": 5}})
    assert none.budgeted_models() == (False, frozenset())
