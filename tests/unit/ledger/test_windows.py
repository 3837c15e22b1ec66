"""Reconciliation windows: reading the engine's counters and settling a window exactly."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from proxy.ledger.records import UsageRecord
from proxy.ledger.windows import EngineReading, Tally, parse_engine_counters, settle

NOW = datetime(2026, 11, 30, tzinfo=UTC)


def test_parse_sums_every_label_set() -> None:
    """Counters are summed over models and engines; the start time marks restarts."""
    text = (
        "# TYPE vllm:prompt_tokens_total counter\n"
        'vllm:prompt_tokens_total{engine="0",model_name="a"} 36.0\n'
        'vllm:prompt_tokens_total{engine="1",model_name="b"} 4.0\n'
        'vllm:generation_tokens_total{engine="0",model_name="a"} 7.0\n'
        "process_start_time_seconds 1.7e9\n"
        'vllm:prompt_tokens_created{model_name="a"} 1.7e9\n'
    )
    assert parse_engine_counters(text) == EngineReading(40, 7, 1.7e9)
    with pytest.raises(ValueError, match="no vllm:prompt_tokens_total"):
        parse_engine_counters("up 1\n")


def record(billed: int, verdict: str = "corrected") -> UsageRecord:
    return UsageRecord(
        tenant="t",
        endpoint="/rerank",
        operation="rerank",
        prompt_tokens_reported=billed + 21,
        prompt_tokens_billed=billed,
        verdict=verdict,
        status=200,
        latency_ms=1.0,
        instance="i",
    )


@pytest.mark.parametrize(
    ("engine", "billed", "verdict", "unbilled", "over", "cause"),
    [
        (36, 36, "corrected", 0, 0, None),
        (50, 36, "corrected", 14, 0, "unmetered_traffic"),
        (30, 36, "mismatch", 0, 6, "unproven_records"),
        (30, 36, "corrected", 0, 6, "overbilled"),
    ],
)
def test_settle_is_exact(
    engine: int, billed: int, verdict: str, unbilled: int, over: int, cause: str | None
) -> None:
    """Zero drift is zero; drift names the causes the proxy can see."""
    tally = Tally()
    tally.add(record(billed, verdict))
    window = settle(
        EngineReading(100, 0, 1.0),
        EngineReading(100 + engine, 0, 1.0),
        tally,
        start=NOW,
        end=NOW,
        instance="i",
        upstream="u",
    )
    assert (window.unbilled_prompt_tokens, window.overbilled_prompt_tokens) == (unbilled, over)
    assert [c.split(":")[0] for c in window.causes] == ([cause] if cause else [])
    assert window.reported_prompt_tokens == billed + 21


@pytest.mark.parametrize(
    "after", [EngineReading(10, 0, 1.0), EngineReading(500, 0, 2.0)], ids=["down", "restarted"]
)
def test_a_restart_claims_no_drift(after: EngineReading) -> None:
    """A counter that went down or a new engine start time: growth unknown, no drift."""
    tally = Tally()
    tally.add(record(36))
    window = settle(
        EngineReading(100, 0, 1.0), after, tally, start=NOW, end=NOW, instance="i", upstream="u"
    )
    assert window.status == "counter_reset"
    assert window.engine_prompt_tokens is None
    assert (window.unbilled_prompt_tokens, window.overbilled_prompt_tokens) == (0, 0)


@pytest.mark.parametrize(
    ("operation", "n", "expected"),
    [
        ("chat", 3, 15),
        ("completions", 2, 10),
        ("generate", 4, 20),
        ("rerank", 3, 5),
        ("chat", None, 5),
    ],
)
def test_n_choices_are_expected_n_times(operation: str, n: int | None, expected: int) -> None:
    """Issue #44 case 4: each of ``n`` choices reads the prompt, so the engine's counter
    grows n times what the usage bills once; a window of such requests settles with no
    drift (it reported the difference as unmetered traffic every window). ``n`` of a
    scoring record counts documents, never copies of a prompt."""
    tally = Tally()
    tally.add(
        UsageRecord(
            tenant="t",
            endpoint="/x",
            operation=operation,
            prompt_tokens_reported=5,
            prompt_tokens_billed=5,
            n=n,
            status=200,
            latency_ms=1.0,
            instance="i",
        )
    )
    window = settle(
        EngineReading(100, 0, 1.0),
        EngineReading(100 + expected, 0, 1.0),
        tally,
        start=NOW,
        end=NOW,
        instance="i",
        upstream="u",
    )
    assert (window.unbilled_prompt_tokens, window.overbilled_prompt_tokens) == (0, 0)
    assert window.billed_prompt_tokens == 5
