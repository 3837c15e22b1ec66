"""Reconciliation windows: reading the engine's counters and settling a window exactly."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from proxy.ledger.records import UsageRecord
from proxy.ledger.windows import (
    GENERATION_COUNTER,
    PROMPT_COUNTER,
    START_TIME,
    EngineReading,
    SettledWindow,
    Tally,
    parse_engine_counters,
    parse_entry,
    settle,
)

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


def _by_the_library(text: str) -> EngineReading:
    """The reading as prometheus_client's own parser makes it: the reference."""
    totals = {PROMPT_COUNTER: 0.0, GENERATION_COUNTER: 0.0}
    seen, started = set(), None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in totals:
                totals[sample.name] += sample.value
                seen.add(sample.name)
            elif sample.name == START_TIME:
                started = sample.value
    if PROMPT_COUNTER not in seen:
        raise ValueError(f"no {PROMPT_COUNTER} in the upstream's metrics")
    return EngineReading(round(totals[PROMPT_COUNTER]), round(totals[GENERATION_COUNTER]), started)


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


NAMES = st.sampled_from(
    [
        PROMPT_COUNTER,
        GENERATION_COUNTER,
        START_TIME,
        "vllm:prompt_tokens_created",
        "vllm:prompt_tokens_total_x",
        "vllm:num_requests_running",
    ]
)
LABELS = st.dictionaries(
    st.sampled_from(["engine", "model_name", "le"]),
    st.text(st.sampled_from('ab0 {}",=\\\n#'), max_size=8),
    max_size=2,
)
VALUES = st.one_of(
    st.integers(0, 10**12).map(str),
    st.integers(0, 10**6).map(lambda n: f"{n}.0"),
    st.floats(0, 1e9, allow_nan=False).map(repr),
)
TIMESTAMPS = st.one_of(st.none(), st.integers(0, 2 * 10**12))


@st.composite
def _exposition(draw: st.DrawFn) -> str:
    lines = []
    for name, labels, value, stamp in draw(
        st.lists(st.tuples(NAMES, LABELS, VALUES, TIMESTAMPS), max_size=8)
    ):
        if draw(st.booleans()):
            lines.append(f"# HELP {name} a help text with {{braces}} and 1 2 3")
        label_text = ",".join(f'{k}="{_escaped(v)}"' for k, v in labels.items())
        sample = name + (f"{{{label_text}}}" if labels else "") + f" {value}"
        lines.append(sample + ("" if stamp is None else f" {stamp}"))
        if draw(st.booleans()):
            lines.append("")
    return "\n".join(lines) + "\n"


@given(_exposition())
def test_the_fast_reading_agrees_with_prometheus_client(text: str) -> None:
    """Whatever the label values (braces, quotes, spaces, escapes), comments and
    timestamps, the fast parser reads what prometheus_client's parser reads, or both
    find no prompt counter."""
    try:
        expected: EngineReading | str = _by_the_library(text)
    except ValueError as exc:
        expected = str(exc)
    try:
        got: EngineReading | str = parse_engine_counters(text)
    except ValueError as exc:
        got = str(exc)
    assert got == expected


def test_a_timestamp_is_not_read_as_the_value() -> None:
    """Regression: a sample with a timestamp (``name value ms``) was read as its timestamp."""
    text = (
        'vllm:prompt_tokens_total{model_name="a b"} 36 1764750000000\n'
        "vllm:generation_tokens_total 7 1764750000000\n"
        "process_start_time_seconds 1.7e9 1764750000000\n"
    )
    assert parse_engine_counters(text) == EngineReading(36, 7, 1.7e9) == _by_the_library(text)


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
    assert [c.code for c in window.causes] == ([cause] if cause else [])
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


def test_reconciliation_tallies_tokens_only() -> None:
    """Audio seconds and cached prompt tokens never enter the tally the engine's token
    counters are compared with; the cached tokens are within the prompt already counted."""
    from proxy.ledger.records import Units
    from tests.support.records import make_record

    base = make_record(0).model_dump(exclude={"record_id", "units"})
    audio = UsageRecord(
        **{**base, "prompt_tokens_reported": None, "prompt_tokens_billed": None},
        units=Units(audio_seconds=30),
    )
    cached = UsageRecord(**base, units=Units(cached_prompt_tokens=30))
    tally = Tally()
    tally.add(audio)
    tally.add(cached)
    assert (tally.records, tally.prompt_billed, tally.prompt_expected) == (2, 36, 36)


def test_drift_from_transcriptions_billed_in_seconds_is_named() -> None:
    """A whole transcription is billed in seconds; the engine still counts its decoder
    prompt tokens: the window's unbilled tokens name it as a cause, before unmetered
    traffic (which it may also be)."""
    from proxy.ledger.records import Units
    from tests.support.records import make_record

    base = make_record(0).model_dump(exclude={"record_id", "units"})
    audio = UsageRecord(
        **{**base, "prompt_tokens_reported": None, "prompt_tokens_billed": None},
        units=Units(audio_seconds=30),
    )
    tally = Tally()
    tally.add(audio)
    window = settle(
        EngineReading(100, 0, 1.0),
        EngineReading(104, 0, 1.0),
        tally,
        start=NOW,
        end=NOW,
        instance="i",
        upstream="u",
    )
    assert window.unbilled_prompt_tokens == 4
    assert [c.code for c in window.causes] == ["billed_in_seconds", "unmetered_traffic"]


def _audio(operation: str, prompt: int | None = None, seconds: int | None = None) -> UsageRecord:
    """An audio record as the proxy writes it: streamed (tokens) or whole (seconds)."""
    from proxy.ledger.records import Units

    return UsageRecord(
        tenant="t",
        endpoint=f"/v1/audio/{operation}",
        operation=operation,
        prompt_tokens_reported=prompt,
        prompt_tokens_billed=prompt,
        completion_tokens_reported=None if prompt is None else 8,
        completion_tokens_billed=None if prompt is None else 8,
        status=200,
        latency_ms=1.0,
        instance="i",
        units=Units(audio_seconds=seconds),
    )


@pytest.mark.parametrize(
    ("engine", "over", "unbilled", "names"),
    [
        (4, 360, 0, ["audio_tokens"]),
        (369, 0, 5, ["audio_tokens", "unmetered_traffic"]),
    ],
    ids=["audio-tokens-billed", "more-engine-work"],
)
def test_drift_from_streamed_audio_names_its_audio_tokens(
    engine: int, over: int, unbilled: int, names: list[str]
) -> None:
    """A streamed transcription as real vLLM answers it (issue #49: 3.6 s of audio, usage
    364 prompt tokens, the engine's counter +4): the 360 audio tokens billed are named as
    the cause, not as a counting defect; engine work beyond the usage still shows as
    traffic the proxy did not see."""
    tally = Tally()
    tally.add(_audio("transcriptions", prompt=364))
    window = settle(
        EngineReading(100, 0, 1.0),
        EngineReading(100 + engine, 0, 1.0),
        tally,
        start=NOW,
        end=NOW,
        instance="i",
        upstream="u",
    )
    assert (window.overbilled_prompt_tokens, window.unbilled_prompt_tokens) == (over, unbilled)
    assert [c.code for c in window.causes] == names
    assert str(window.causes[0]).startswith("audio_tokens: 1 streamed transcription(s)")


def test_only_streamed_audio_counts_as_audio_tokens() -> None:
    """A whole transcription (seconds) and a stream recorded without usage are no audio
    streams, nor a chat stream; merging carries the count."""
    chat = _audio("translations", prompt=5).model_dump(exclude={"record_id", "operation"})
    records = [
        _audio("transcriptions", seconds=3),
        _audio("translations"),
        UsageRecord(**chat, operation="chat"),
        _audio("translations", prompt=5),
    ]
    tally, other = Tally(), Tally()
    for one in records:
        tally.add(one)
    other.merge(tally)
    assert (tally.audio_streams, other.audio_streams) == (1, 1)


def test_causes_are_codes_with_a_sentence() -> None:
    """Issue #59 item 5: the window's JSON held each cause as a sentence ("shared_upstream:
    9 prompt ...") that a program had to split. Each is now a stable ``code`` and its
    ``message``, and the window says so by its ``schema_version`` (5; 4 had sentences),
    so a consumer that split sentences sees the change; a window journaled before reads
    back with the same codes and its own version."""
    tally = Tally()
    tally.upstream_errors = 1
    window = settle(
        EngineReading(100, 0, 1.0),
        EngineReading(109, 0, 1.0),
        tally,
        start=NOW,
        end=NOW,
        instance="i",
        upstream="u",
        shared=True,
    )
    causes = json.loads(window.to_json())["causes"]
    assert json.loads(window.to_json())["schema_version"] == 5  # a consumer can tell
    assert [c["code"] for c in causes] == ["shared_upstream"]
    assert causes[0]["message"].startswith("9 prompt and 0 completion token(s)")
    old = json.loads(window.to_json())
    old["causes"] = ["unmetered_traffic: engine work without a record of this proxy"]
    old["schema_version"] = 4
    again = parse_entry(json.dumps(old, separators=(",", ":")))  # as journaled
    assert isinstance(again, SettledWindow)
    assert again.schema_version == 4
    assert [(c.code, c.message) for c in again.causes] == [
        ("unmetered_traffic", "engine work without a record of this proxy")
    ]
