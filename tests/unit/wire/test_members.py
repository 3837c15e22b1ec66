"""The top-level ``usage`` of a JSON object read as it passes, chunk by chunk, is the one a
client's ``json.loads`` reads (issue #27, case 4)."""

from __future__ import annotations

import itertools
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.wire.members import USAGE_MAX_BYTES, TopLevelMembers

NAMES = st.sampled_from(["usage", "error", "data", "choices", "id", "u", 'us"age', "\\", "usage\\"])
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(
        alphabet=st.sampled_from(['"', "\\", "{", "}", "[", "]", ",", ":", "a", "é", "\n", "u"]),
        max_size=12,
    )
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(NAMES, inner, max_size=4),
    max_leaves=20,
)


def scan(text: bytes, cuts: list[int]) -> Any:
    members = TopLevelMembers()
    points = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    for a, b in itertools.pairwise(points):
        members.feed(text[a:b])
    return members.usage()


def expected(obj: dict[str, Any]) -> Any:
    return None if "error" in obj else obj.get("usage")


@settings(max_examples=400, deadline=None)
@given(
    members=st.lists(st.tuples(NAMES, VALUES), max_size=6),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=8),
    compact=st.booleans(),
    ascii_only=st.booleans(),
    bytewise=st.booleans(),
)
def test_the_usage_read_as_it_passes_is_the_one_json_loads_reads(
    members: list[tuple[str, Any]],
    cuts: list[int],
    compact: bool,
    ascii_only: bool,
    bytewise: bool,
) -> None:
    """Property: any object, repeated members included (the last one counts, as for
    json.loads), any separators, any escaping, cut anywhere (inside strings, between a
    backslash and what it escapes)."""
    separators = (",", ":") if compact else (", ", ": ")
    body = (
        "{"
        + separators[0].join(
            json.dumps(k, ensure_ascii=ascii_only)
            + separators[1]
            + json.dumps(v, ensure_ascii=ascii_only, separators=separators)
            for k, v in members
        )
        + "}"
    )
    text = body.encode()
    if bytewise:  # every cut there is: between a backslash and what it escapes, too
        cuts = list(range(len(text)))
    assert scan(text, cuts) == expected(json.loads(text))


def test_a_usage_before_megabytes_of_prompt_logprobs_is_found() -> None:
    """vLLM writes ``prompt_logprobs`` after ``usage``: far more than 64 KiB after it."""
    usage = {"prompt_tokens": 12, "total_tokens": 20, "completion_tokens": 8}
    logprobs = [{"1": {"logprob": -0.5, "rank": 1, "decoded_token": '"}'}}] * 40_000
    answer = {"id": "x", "choices": [{"message": {"content": "usage"}}], "usage": usage}
    text = json.dumps({**answer, "prompt_logprobs": logprobs}).encode()
    assert len(text) > 2 * 1024 * 1024
    assert scan(text, list(range(0, len(text), 65_536))) == usage


def test_nested_usage_members_and_errors_do_not_count() -> None:
    assert scan(b'{"data": {"usage": {"prompt_tokens": 1}}}', []) is None
    assert scan(b'{"usage": {"prompt_tokens": 1}, "error": {"code": 500}}', []) is None
    assert scan(b'{"usage": {"prompt_tokens": 1}} trailing', []) is None
    assert scan(b'[{"usage": 1}]', []) is None
    assert scan(b'{"usage": {"prompt_tokens": 1}', [5]) is None  # never closed


def test_an_oversized_usage_is_not_kept() -> None:
    huge = {"prompt_tokens": 1, "padding": "x" * USAGE_MAX_BYTES}
    assert scan(json.dumps({"usage": huge}).encode(), [100, 70_000]) is None
    assert scan(b'{"us\\u0061ge": {"prompt_tokens": 3}}', [4]) == {"prompt_tokens": 3}
