"""Surgical edits of the usage object: only the numbers move."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from proxy.wire.usage import (
    Reading,
    annotate_usage,
    find_usage,
    is_error_body,
    read_usage,
    reading_of,
    rewrite_usage,
)

RERANK = (
    b'{"id":"score-1","model":"m","usage":{"prompt_tokens":57,"total_tokens":57},'
    b'"results":[{"index":0,"document":{"text":"\\"usage\\":{\\"prompt_tokens\\":1}",'
    b'"multi_modal":null},"relevance_score":0.8560696840286255}]}'
)
SCORE = (
    b'{"id":"score-2","object":"list","created":1,"model":"m","data":[{"index":0,'
    b'"object":"score","score":1e-05}],"usage":{"prompt_tokens":19,"total_tokens":19,'
    b'"completion_tokens":0,"prompt_tokens_details":null,"completion_tokens_details":null}}'
)


def test_rewrite_changes_only_the_numbers() -> None:
    """A document that contains the text "usage" is not mistaken for the usage object."""
    view = find_usage(RERANK)
    assert view is not None
    assert view.reported == 57
    out = rewrite_usage(view, 36)
    assert out == RERANK.replace(
        b'"prompt_tokens":57,"total_tokens":57', b'"prompt_tokens":36,"total_tokens":36'
    )


def test_rewrite_keeps_float_formatting_and_order() -> None:
    """1e-05 stays 1e-05; key order and the other usage members are untouched."""
    view = find_usage(SCORE)
    assert view is not None
    out = rewrite_usage(view, 18)
    assert b'"score":1e-05' in out
    assert list(json.loads(out)["usage"]) == list(json.loads(SCORE)["usage"])
    assert json.loads(out)["usage"]["prompt_tokens"] == 18


def test_old_rerank_usage_has_only_total_tokens() -> None:
    """Before 0.13 rerank usage was {"total_tokens"} only."""
    body = b'{"id":"x","usage":{"total_tokens":57},"results":[]}'
    view = find_usage(body)
    assert view is not None
    assert view.reported == 57
    assert rewrite_usage(view, 36) == b'{"id":"x","usage":{"total_tokens":36},"results":[]}'


def test_annotate_appends_members() -> None:
    """annotate keeps R and appends engine_prompt_tokens and usage_verdict."""
    view = find_usage(SCORE)
    assert view is not None
    usage = json.loads(annotate_usage(view, 18, "corrected"))["usage"]
    assert usage["prompt_tokens"] == 19
    assert usage["engine_prompt_tokens"] == 18
    assert usage["usage_verdict"] == "corrected"


def test_whitespace_bodies_are_edited_in_place() -> None:
    """Pretty-printed bodies keep their layout."""
    body = json.dumps({"usage": {"prompt_tokens": 7, "total_tokens": 7}, "x": [1]}, indent=2)
    view = find_usage(body.encode())
    assert view is not None
    assert rewrite_usage(view, 5).decode() == body.replace("7", "5")


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b"[1, 2]",
        b'{"object":"error","message":"no"}',
        b'{"usage": null}',
        b'{"usage": {"prompt_tokens": "12"}}',
        b'{"usage": {"prompt_tokens": true}}',
        b'{"usage": {"prompt_tokens": 3}} trailing',
        b'\xff\xfe{"usage": {}}',
    ],
)
def test_bodies_without_usable_usage(body: bytes) -> None:
    """Errors and malformed bodies are never audited."""
    view = find_usage(body)
    assert view is None or view.reported is None


@given(
    st.recursive(
        st.none() | st.booleans() | st.floats(allow_nan=False) | st.text(),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
        max_leaves=10,
    ),
    st.integers(min_value=0, max_value=10**6),
    st.integers(min_value=0, max_value=10**6),
)
def test_rewrite_roundtrip_property(extra: object, reported: int, engine: int) -> None:
    """Property: rewriting parses to the original with only the two numbers changed."""
    original = {
        "id": "x",
        "extra": extra,
        "usage": {"prompt_tokens": reported, "total_tokens": reported},
    }
    view = find_usage(json.dumps(original, ensure_ascii=False).encode())
    assert view is not None
    assert view.reported == reported
    rewritten = json.loads(rewrite_usage(view, engine))
    assert rewritten == {**original, "usage": {"prompt_tokens": engine, "total_tokens": engine}}


@settings(max_examples=200, deadline=None)
@given(st.text(), st.text(), st.integers(min_value=0, max_value=10**6))
def test_edits_splice_bytes_around_any_text(before: str, after: str, engine: int) -> None:
    """Property: with any characters (multi-byte ones included) before and after the
    usage object, the byte-level edit gives the same body as editing the text would."""
    body = (
        '{"id":' + json.dumps(before, ensure_ascii=False) + ',"usage":{"prompt_tokens":7,'
        '"total_tokens":7},"results":[{"document":{"text":'
        + json.dumps(after, ensure_ascii=False)
        + "}}]}"
    ).encode()
    view = find_usage(body)
    assert view is not None
    text = body.decode()
    assert (
        rewrite_usage(view, engine)
        == text.replace(
            '"prompt_tokens":7,"total_tokens":7',
            f'"prompt_tokens":{engine},"total_tokens":{engine}',
            1,
        ).encode()
    )
    assert (
        annotate_usage(view, engine, "corrected")
        == text.replace(
            '"total_tokens":7}',
            f'"total_tokens":7,"engine_prompt_tokens":{engine},"usage_verdict":"corrected"}}',
            1,
        ).encode()
    )


@pytest.mark.parametrize(
    "body",
    [
        b'{"usage":{"prompt_tokens":5,"total_tokens":5},"error":{"message":"x"}}',
        b'{"usage":{"prompt_tokens":5,"total_tokens":5},"object":"error","message":"x"}',
    ],
)
def test_error_markers_after_usage_are_seen(body: bytes) -> None:
    """The scan stops at usage only when nothing after it could matter."""
    assert find_usage(body) is None


def test_repeated_usage_after_results_is_seen() -> None:
    """A second usage member after a large results array still makes the view invalid."""
    body = RERANK[:-1] + b',"usage":{"prompt_tokens":1,"total_tokens":1}}'
    view = find_usage(body)
    assert view is not None
    assert view.problem is not None
    assert view.reported is None


def _as_a_client_reads_it(payload: bytes) -> Reading | None:
    """The oracle: the usage a Python client reading the answer with ``json.loads`` sees."""
    try:
        parsed = json.loads(payload)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(parsed, dict) or is_error_body(parsed):
        return None
    usage = parsed.get("usage")
    return reading_of(usage) if isinstance(usage, dict) else None


_COUNTS = st.one_of(
    st.integers(-5, 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=5),
)
_USAGE = st.dictionaries(
    st.sampled_from(["prompt_tokens", "completion_tokens", "total_tokens"]), _COUNTS
)
_VALUES = st.one_of(
    _USAGE,
    _COUNTS,
    st.sampled_from(["error", "list", "chat.completion"]),
    st.lists(st.floats(allow_nan=False), max_size=5),
)
_MEMBERS = st.lists(
    st.tuples(st.sampled_from(["usage", "error", "object", "data", "id"]), _VALUES), max_size=6
)


@settings(max_examples=300)
@given(_MEMBERS, st.sampled_from(["object", "bom", "list", "surrogate", "usage surrogate", "cut"]))
@example([("usage", {"prompt_tokens": 3})], "bom")
@example([("data", [0.5]), ("usage", {"prompt_tokens": 3})], "surrogate")
@example([("data", [0.5])], "usage surrogate")
@example([("usage", {"prompt_tokens": 3}), ("usage", {"prompt_tokens": 9})], "object")
def test_metered_usage_is_read_as_a_client_reads_it(
    members: list[tuple[str, object]], form: str
) -> None:
    """Property: ``read_usage`` (pydantic-core reading only the deciding members) gives
    what ``json.loads`` gives, for repeated members, NaN, huge integers, non-objects, a
    byte-order mark, a lone surrogate escape and truncated JSON alike."""
    text = "{" + ",".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in members) + "}"
    if form == "list":
        text = f"[{text}]"
    elif form == "surrogate":  # in a member the proxy does not read
        text = text[:-1] + ("," if members else "") + '"note":"\\ud800"}'
    elif form == "usage surrogate":  # in the usage it reads
        usage = '"usage":{"prompt_tokens":3,"note":"\\ud800"}'
        text = text[:-1] + ("," if members else "") + usage + "}"
    elif form == "cut":
        text = text[: len(text) // 2]
    payload = text.encode()
    if form == "bom":
        payload = b"\xef\xbb\xbf" + payload
    assert read_usage(payload) == _as_a_client_reads_it(payload)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["usage", "data", "x"]), inner, max_size=3)
    ),
    max_leaves=12,
)
_TRAPS = st.sampled_from(['"usage":{"prompt_tokens":1}}', '"usage":', "}", '\\"usage\\":{}}'])


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        # vLLM's Responses API: input_tokens is the whole prompt, cached tokens included
        (
            {
                "input_tokens": 12,
                "input_tokens_details": {"cached_tokens": 8},
                "output_tokens": 4,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": 16,
            },
            Reading(12, 4, cached=8),
        ),
        # vLLM's Anthropic Messages API: input_tokens leaves out what the cache served
        (
            {"input_tokens": 4, "cache_read_input_tokens": 8, "output_tokens": 3},
            Reading(12, 3, cached=8),
        ),
        (
            {
                "input_tokens": 2,
                "cache_read_input_tokens": 8,
                "cache_creation_input_tokens": 2,
                "output_tokens": 3,
            },
            Reading(12, 3, cached=8),
        ),
        ({"input_tokens": 5, "output_tokens": 0}, Reading(5, 0)),
        ({"input_tokens": 5, "output_tokens": True}, None),
        ({"input_tokens": -1, "output_tokens": 2}, None),
        ({"input_tokens": 5, "cache_read_input_tokens": "8", "output_tokens": 2}, None),
    ],
)
def test_input_and_output_tokens_are_the_prompt_and_the_completion(
    usage: dict[str, Any], expected: Reading | None
) -> None:
    """The Responses and Messages APIs name the counts ``input_tokens`` and
    ``output_tokens``; the engine's prompt is the input plus, for Messages, the cached
    parts it reports apart. What is not a token count is invalid, as for any usage."""
    reading = reading_of(usage)
    if expected is None:
        assert reading.problem is not None
        assert (reading.prompt, reading.completion) == (None, None)
    else:
        assert reading == expected


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        # chat/completions with --enable-prompt-tokens-details (0.32.0 UsageInfo)
        (
            {
                "prompt_tokens": 40,
                "completion_tokens": 8,
                "prompt_tokens_details": {"cached_tokens": 32},
            },
            32,
        ),
        # without the flag vLLM sends null details: nothing is inferred
        ({"prompt_tokens": 40, "completion_tokens": 8, "prompt_tokens_details": None}, None),
        # 0.34.0 leaves the member out when there is none
        ({"prompt_tokens": 40, "completion_tokens": 8}, None),
        # 0.34.0's batch chat: cache writes and multimodal tokens beside the cached ones
        (
            {
                "prompt_tokens": 40,
                "completion_tokens": 8,
                "prompt_tokens_details": {
                    "cached_tokens": 16,
                    "created_cache_tokens": 8,
                    "multimodal_tokens": {"image": 12},
                },
                "completion_tokens_details": {"reasoning_tokens": 5},
            },
            16,
        ),
        # details with multimodal_tokens only: cached_tokens null
        ({"prompt_tokens": 40, "prompt_tokens_details": {"cached_tokens": None}}, None),
        # Responses (ResponseUsage: input_tokens_details.cached_tokens is always sent)
        (
            {
                "input_tokens": 40,
                "output_tokens": 8,
                "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            },
            0,
        ),
        (
            {
                "input_tokens": 40,
                "output_tokens": 8,
                "input_tokens_details": {"cached_tokens": 16, "cache_write_tokens": 0},
            },
            16,
        ),
        # Anthropic Messages: input_tokens leaves the cache read out; the prompt is the sum
        ({"input_tokens": 8, "cache_read_input_tokens": 32, "output_tokens": 8}, 32),
    ],
)
def test_cached_prompt_tokens_are_read_where_vllm_reports_them(
    usage: dict[str, Any], expected: int | None
) -> None:
    """Each API's cached-token member is read as reported; absent or null is None."""
    reading = reading_of(usage)
    assert reading.problem is None
    assert reading.cached == expected
    assert reading.prompt == 40


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": 40, "prompt_tokens_details": {"cached_tokens": -1}},
        {"prompt_tokens": 40, "prompt_tokens_details": {"cached_tokens": "32"}},
        {"prompt_tokens": 40, "prompt_tokens_details": {"cached_tokens": 41}},
    ],
)
def test_an_impossible_cached_count_makes_the_reading_invalid(usage: dict[str, Any]) -> None:
    """A cached count that is no token count, or exceeds the prompt, bills nothing."""
    reading = reading_of(usage)
    assert reading.problem is not None
    assert (reading.prompt, reading.cached) == (None, None)


def test_a_transcription_billed_in_seconds_is_read_as_seconds() -> None:
    """vLLM's non-streamed transcription usage (``TranscriptionUsageAudio``, 0.10.2 to
    0.32.0) is seconds, no tokens; seconds that are no whole count make it invalid."""
    body = b'{"text":"hello","usage":{"type":"duration","seconds":7}}'
    assert read_usage(body, missing=True) == Reading(None, None, seconds=7)
    for bad in ("7.5", '"7"', "-1", "null"):
        reading = reading_of(json.loads(f'{{"type":"duration","seconds":{bad}}}'))
        assert reading.problem is not None
        assert reading.seconds is None
