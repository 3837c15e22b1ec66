"""Header values as OpenAI writes them (Go durations) and the retry headers openai-python
reads (retry-after-ms first, x-should-retry)."""

from __future__ import annotations

import math

import pytest

from proxy.limits.headers import duration, ratelimit_headers
from proxy.limits.limiter import Decision, Refusal, Standing


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.0004, "1ms"),
        (0.25, "250ms"),
        (1, "1s"),
        (1.5, "1.5s"),
        (60, "1m0s"),
        (360, "6m0s"),
        (3723.25, "1h2m3.25s"),
        (-3, "0s"),
    ],
)
def test_duration(seconds: float, text: str) -> None:
    """Rounded up to the millisecond, never negative."""
    assert duration(seconds) == text


def test_headers_of_an_admitted_request() -> None:
    """The tightest request and token limits, nothing about retrying."""
    decision = Decision(None, None, Standing(60, 59, 1.0), Standing(1000, 900, 360.0))
    assert ratelimit_headers(decision) == {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "59",
        "x-ratelimit-reset-requests": "1s",
        "x-ratelimit-limit-tokens": "1000",
        "x-ratelimit-remaining-tokens": "900",
        "x-ratelimit-reset-tokens": "6m0s",
    }


@pytest.mark.parametrize(
    ("refusal", "after", "after_ms", "retry"),
    [
        (Refusal("requests_per_second", ("tenant", "a"), 0.7501, 1, 1), "1", "751", None),
        (Refusal("total_tokens_per_day", ("tenant", "a"), 30.0, 5, 9, True), "30", "30000", None),
        (
            Refusal("total_tokens_per_month", ("tenant", "a"), 86400.0, 5, 9, True),
            "86400",
            "86400000",
            "false",
        ),
        (
            Refusal("total_tokens_per_day", ("tenant", "a"), math.inf, 50, 9, True),
            None,
            None,
            "false",
        ),
    ],
)
def test_headers_of_a_refusal(
    refusal: Refusal, after: str | None, after_ms: str | None, retry: str | None
) -> None:
    """retry-after(-ms) exact and rounded up; a distant budget reset or a cost that never
    fits tells the client not to retry."""
    headers = ratelimit_headers(Decision(None, refusal, None, None))
    assert headers.get("retry-after") == after
    assert headers.get("retry-after-ms") == after_ms
    assert headers.get("x-should-retry") == retry


def test_a_money_budget_is_told_in_its_currency() -> None:
    """``x-ratelimit-*-cost`` carries amounts (billionths written as the currency's
    decimals), beside the token and request headers, never in them."""
    decision = Decision(
        None,
        None,
        None,
        Standing(1000, 10, 1.0),
        (),
        Standing(250 * 10**9, 249_999_999_550, 3600.0),
    )
    headers = ratelimit_headers(decision)
    assert headers["x-ratelimit-limit-cost"] == "250"
    assert headers["x-ratelimit-remaining-cost"] == "249.99999955"
    assert headers["x-ratelimit-reset-cost"] == "1h0m0s"
    assert headers["x-ratelimit-remaining-tokens"] == "10"
    assert "x-ratelimit-limit-requests" not in headers
