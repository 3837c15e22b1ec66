"""Mistakes in a limits file said as plain sentences (issue #54 item 4): one per problem,
with what a misspelt name probably meant, never pydantic's dump."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.limits.policy import Policies
from proxy.limits.problems import LimitsFileError, mistakes, read_limits, summary

ACME_KEY = "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b"


def problems_of(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "limits.yaml"
    path.write_text(text)
    with pytest.raises(LimitsFileError) as refused:
        read_limits(path)
    assert "pydantic" not in str(refused.value)
    return refused.value.problems


@pytest.mark.parametrize(
    ("text", "sentence"),
    [
        (
            "tenants: {acme: {prompt_token_per_minute: 5}}",
            "'prompt_token_per_minute' is not a limit or setting of tenant 'acme'; "
            "did you mean 'prompt_tokens_per_minute'?",
        ),
        (
            "tenants: {acme: {requests_per_minut: 5}}",
            "'requests_per_minut' is not a limit or setting of tenant 'acme'; "
            "did you mean 'requests_per_minute'?",
        ),
        (
            "tenants: {acme: {requests_per_fortnight: 5}}",
            "'requests_per_fortnight' is not a limit or setting of tenant 'acme': a limit is "
            "<unit>_per_<window>, unit requests, prompt_tokens, completion_tokens, "
            "total_tokens, cost, window second, minute, hour, day, week, month",
        ),
        (
            "tenants: {acme: {models: {big: {total_tokenz_per_day: 5}}}}",
            "'total_tokenz_per_day' is not a limit or setting of tenants.acme.models.big; "
            "did you mean 'total_tokens_per_day'?",
        ),
        (
            "default: {bananas_per_hour: 5}",
            "'bananas_per_hour' is not a limit or setting of default: a limit is "
            "<unit>_per_<window>, unit requests, prompt_tokens, completion_tokens, "
            "total_tokens, cost, window second, minute, hour, day, week, month",
        ),
        (
            "tenant: {acme: {requests_per_day: 5}}",
            "'tenant' is not a key of a limits file (timezone, default, tenants); "
            "did you mean 'tenants'?",
        ),
        (
            "tenants: {acme: {concurrency: 0}}",
            "tenants.acme.concurrency is 0: a limit is a whole number above 0",
        ),
        (
            "tenants: {acme: {requests_per_day: ten}}",
            "tenants.acme.requests_per_day is 'ten': a limit is a whole number above 0",
        ),
        ("tenants: {acme: [5]}", "tenants.acme must be a mapping of names to values, not a list"),
        ("[1, 2]", "the file must be a mapping of names to values, not a list"),
        (
            "tenants: {acme: {fail_mode: shut}}",
            "tenants.acme.fail_mode is 'shut': it takes closed, open or local",
        ),
        (
            "timezone: Europe/Pari",
            "timezone 'Europe/Pari' is not a time zone (e.g. Europe/Paris); "
            "did you mean 'Europe/Paris'?",
        ),
        (
            "tenants: [",
            "not valid YAML or JSON at line 1 (expected the node content, "
            "but found '<stream end>')",
        ),
    ],
)
def test_each_mistake_is_one_plain_sentence(tmp_path: Path, text: str, sentence: str) -> None:
    """Before: `1 validation error for Policies ... Extra inputs are not permitted
    [type=extra_forbidden, ...] For further information visit https://errors.pydantic.dev`."""
    assert problems_of(tmp_path, text) == [sentence]


def test_every_problem_of_a_file_is_said(tmp_path: Path) -> None:
    """Three mistakes, three sentences; the message counts them."""
    text = "tenants: {acme: {requests_per_minut: 5, concurrency: -1}, globex: 3}"
    path = tmp_path / "limits.yaml"
    path.write_text(text)
    with pytest.raises(LimitsFileError) as refused:
        read_limits(path)
    assert len(refused.value.problems) == 3
    assert str(refused.value).startswith("3 problems: ")


def test_the_summary_counts_levels_limits_and_budgets() -> None:
    """What a start-up log line and `limits check` report."""
    policies = Policies.model_validate(
        {
            "default": {"requests_per_minute": 60},
            "tenants": {
                "acme": {
                    "total_tokens_per_month": 1000,
                    "concurrency": 4,
                    "models": {"big": {"prompt_tokens_per_day": 10}},
                    "keys": {ACME_KEY: {}},
                }
            },
        }
    )
    seen = summary(policies)
    assert (seen.tenants, seen.default, seen.levels, seen.limits, seen.budgets) == (
        1,
        True,
        3,
        4,
        2,
    )
    assert str(seen) == (
        "4 limit(s) at 3 level(s) (2 calendar budget(s)): 1 tenant(s), a default for every "
        "other tenant"
    )


@pytest.mark.parametrize("text", ["", "timezone: Europe/Paris\n", "tenants: {acme: {}}\n"])
def test_a_file_that_limits_nothing_is_a_mistake(tmp_path: Path, text: str) -> None:
    """An empty file (or one with no limit in it) loads, but leaves every tenant unlimited:
    said, not taken silently."""
    path = tmp_path / "limits.yaml"
    path.write_text(text)
    assert mistakes(read_limits(path)) == ["the file sets no limit: every tenant is unlimited"]


def test_models_tenants_and_keys_the_proxy_does_not_know() -> None:
    """A model the upstream does not serve, a tenant the key file does not name (no
    request is ever billed to it), a key not among its tenant's: one line each."""
    policies = Policies.model_validate(
        {
            "tenants": {
                "acme": {
                    "requests_per_day": 5,
                    "models": {"bge-rerankr": {"requests_per_day": 1}, "e5": {}},
                    "keys": {ACME_KEY: {"requests_per_day": 1}, "abcdef012345": {}},
                },
                "acmee": {"requests_per_day": 5},
            }
        }
    )
    found = mistakes(
        policies,
        models=["bge-reranker", "e5"],
        tenants=["acme"],
        digests={ACME_KEY: "acme"},
    )
    assert found == [
        "tenants.acme.models.bge-rerankr: the upstream serves no model 'bge-rerankr' (it "
        "serves bge-reranker, e5); did you mean 'bge-reranker'?",
        "tenants.acme.keys.abcdef012345: no key of 'acme' in the --api-keys file has this digest",
        "tenants.acmee: no tenant 'acmee' in the --api-keys file, so no request is ever "
        "billed to it; did you mean 'acme'?",
    ]
    assert mistakes(policies) == []


def test_a_tenant_listed_twice_is_refused_with_both_lines(tmp_path: Path) -> None:
    """Issue #59 item 3: a tenant listed twice was taken, its first block silently dropped.
    The file is refused, naming the tenant and both lines."""
    text = (
        "tenants:\n"
        "  acme: {requests_per_day: 5}\n"
        "  globex: {requests_per_day: 5}\n"
        "  acme: {requests_per_day: 50}\n"
    )
    (problem,) = problems_of(tmp_path, text)
    assert problem.startswith("'acme' is given twice, at lines 2 and 4")


def test_a_name_given_twice_does_not_hide_the_files_other_problems(tmp_path: Path) -> None:
    """Issue #59 item 3 (one pass): a tenant listed twice stopped the reading, so the
    file's other problems (a misspelt limit, a zone, a value that is no limit) were found
    one rerun at a time. The name given twice is said with every other problem."""
    text = (
        "timezone: Paris\n"
        "tenants:\n"
        "  acme: {prompt_token_per_minute: 5}\n"
        "  acme: {requests_per_day: 1.5}\n"
    )
    problems = problems_of(tmp_path, text)
    assert problems[0].startswith("'acme' is given twice, at lines 3 and 4")
    said = " ".join(problems)
    assert "did you mean 'Europe/Paris'?" in said
    assert "tenants.acme.requests_per_day is 1.5" in said
    assert len(problems) == 3


def test_a_name_given_twice_in_a_valid_file_is_said_with_what_it_gets_wrong(
    tmp_path: Path,
) -> None:
    """A file that validates once YAML has kept the later block is still refused for the
    name given twice, with what the file gets wrong besides (here: it limits nothing)."""
    problems = problems_of(tmp_path, "tenants:\n  acme: {}\n  acme: {}\n")
    assert problems == [
        "'acme' is given twice, at lines 2 and 3: a name may appear once only "
        "(YAML would silently keep the later)",
        "the file sets no limit: every tenant is unlimited",
    ]


@pytest.mark.parametrize(
    ("text", "said", "leak"),
    [
        ("default: {requests_per_day: 1.5}", "default.requests_per_day is 1.5:", "Decimal("),
        ("default: {cost_per_minute: '1'}", "cost_per_minute: money is budgeted", "Value error"),
        ("default: {cost_per_day: '0'}", "default.cost_per_day: 0 is not above zero", "Value"),
        ("timezone: Paris", "did you mean 'Europe/Paris'?", "Value error"),
        ("timezone: new york", "did you mean 'America/New_York'?", "Value error"),
    ],
)
def test_no_pydantic_wording_reaches_the_operator(
    tmp_path: Path, text: str, said: str, leak: str
) -> None:
    """Issue #59 item 4: pydantic's wording leaked (`Value error, ...`, `Decimal('1.5')`),
    and `timezone: Paris` got no suggestion (`Europe/Pariss` did). Each problem is said in
    the file's words; a zone is matched by its last part too."""
    (problem,) = problems_of(tmp_path, text)
    assert said in problem
    assert leak not in problem
