"""Admission's refusals: each in the shape its clients read (vLLM's error, a rate limit in
OpenAI's), and the words a limit's refusal says. (Refusals through the whole proxy:
tests/app/test_limits.py, test_money.py.)"""

from __future__ import annotations

import json

import pytest

from proxy.limits.headers import ratelimit_headers
from proxy.limits.limiter import Decision, Refusal
from proxy.serving.refusals import (
    NOT_COUNTED,
    NOT_IN_TIME,
    Refused,
    refused_by,
    retry_counted,
    undiscovered,
    unreadable,
)

TENANT = ("tenant", "acme")


def body(refused: Refused) -> dict[str, object]:
    text = refused.answer().text
    assert text is not None
    error: dict[str, object] = json.loads(text)["error"]
    return error


def test_a_rate_limit_is_answered_in_openai_s_shape() -> None:
    """A 429 names the units limited as its ``type`` and ``rate_limit_exceeded`` as its
    code, which OpenAI's clients read to back off; it says when to try again."""
    refused = refused_by(Refusal("total_tokens_per_minute", TENANT, 12.0, 50, 40), False, str)
    answer = refused.answer()
    assert answer.status == 429
    error = body(refused)
    assert (error["type"], error["code"], error["param"]) == ("tokens", "rate_limit_exceeded", None)
    assert error["message"] == (
        "Rate limit reached for total_tokens_per_minute of tenant:acme: limit 40, "
        "requested 50. Please try again in 12s."
    )
    assert "x-should-retry" not in answer.headers


@pytest.mark.parametrize(
    ("limit", "kind"),
    [("requests_per_second", "requests"), ("concurrency", "requests"), ("cost_per_day", "cost")],
)
def test_a_rate_limit_s_type_is_the_units_limited(limit: str, kind: str) -> None:
    """Requests and concurrency limit requests; a money budget limits cost."""
    assert refused_by(Refusal(limit, TENANT, 1.0, 1, 1), False, str).kind == kind


def test_money_is_said_as_the_caller_writes_it() -> None:
    """A money budget's amounts are written by ``said`` (the price table's currency)."""
    refused = refused_by(Refusal("cost_per_day", TENANT, 60.0, 7, 5), False, lambda n: f"{n} EUR")
    assert "limit 5 EUR, requested 7 EUR" in refused.message


def test_a_request_beyond_the_whole_limit_is_refused_for_good() -> None:
    """A request that alone costs more than the limit can never fit: 400, not a 429 to
    retry; with no completion cap, the message says how to bound it."""
    alone = Refusal("total_tokens_per_day", TENANT, float("inf"), 900, 100, budget=True)
    capped, uncapped = refused_by(alone, False, str), refused_by(alone, True, str)
    assert (capped.status, uncapped.status) == (400, 400)
    assert capped.message.startswith("This request alone costs 900, more than the whole")
    assert "max_tokens" not in capped.message
    assert "set max_tokens" in uncapped.message


def test_limits_that_cannot_answer_are_a_503_saying_why() -> None:
    """A store that cannot answer is a 503, its reason said as a sentence."""
    down = Refusal("limits_store", TENANT, 5.0, 0, 0, unavailable=True, why="the store is gone")
    refused = refused_by(down, False, str)
    assert (refused.status, refused.message) == (503, "The store is gone; please try again later.")
    assert body(refused)["type"] == "ServiceUnavailable"


def test_an_unreadable_shape_is_final_and_in_vllm_s_shape() -> None:
    """A request whose cost cannot be read is never admitted as it is: a 400 in vLLM's
    shape that tells clients not to retry."""
    refused = unreadable("its messages are not a list")
    answer = refused.answer()
    assert answer.status == 400
    assert answer.headers["x-should-retry"] == "false"
    error = body(refused)
    assert (error["type"], error["code"]) == ("BadRequestError", 400)
    assert "its messages are not a list, so its cost is not known" in str(error["message"])


def test_a_request_before_discovery_is_a_503_that_may_be_retried() -> None:
    """Before the first discovery no model prices a request: a 503 in vLLM's shape that
    says why discovery has not succeeded, and no ``x-should-retry: false`` (it may be
    admitted once the models are known)."""
    refused = undiscovered("discovery failed: connection refused")
    answer = refused.answer()
    assert answer.status == 503
    assert "x-should-retry" not in answer.headers
    message = body(refused)["message"]
    assert isinstance(message, str)
    assert "not yet discovered the upstream's models (discovery failed" in message


def test_a_late_bound_beyond_the_whole_limit_may_be_retried() -> None:
    """A request priced at its bound because its count came late is not one that "can
    never be admitted": beyond the whole limit it is a 503 saying so, to try again."""
    alone = Refusal("prompt_tokens_per_day", TENANT, float("inf"), 30000, 10000, budget=True)
    for why in (NOT_IN_TIME, NOT_COUNTED):
        late = refused_by(alone, False, str, late=why)
        assert late.status == 503
        assert why in late.message
        assert "never" not in late.message
    assert refused_by(alone, False, str).status == 400


def test_a_late_bound_beyond_what_is_left_is_told_to_retry_soon() -> None:
    """A bound that fits the whole day's budget but not what is left of it: its count may
    come on a retry and fit at once, so the 429 says to try again in a second, not at
    the budget's reset hours away, in its message and its headers (``retry-after``, and
    no ``x-should-retry: false``); a counted request's refusal still waits for the reset,
    and a store that cannot answer is left as it is."""
    spent = Refusal("prompt_tokens_per_day", TENANT, 7200.0, 30000, 40000, budget=True)
    late = refused_by(spent, False, str, late=NOT_IN_TIME)
    assert late.status == 429
    assert "try again in 1s" in late.message
    assert NOT_IN_TIME in late.message
    assert "try again in 2h0m0s" in refused_by(spent, False, str).message
    for refusal in (spent, Refusal("prompt_tokens_per_day", TENANT, float("inf"), 1, 1)):
        headers = ratelimit_headers(retry_counted(Decision(None, refusal, None, None)))
        assert (headers["retry-after"], headers.get("x-should-retry")) == ("1", None)
    assert ratelimit_headers(Decision(None, spent, None, None))["x-should-retry"] == "false"
    gone = Decision(None, Refusal("x", TENANT, 0.0, 1, 1, unavailable=True), None, None)
    assert retry_counted(gone) is gone
