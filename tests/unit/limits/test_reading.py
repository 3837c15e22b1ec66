"""What admission reads of a body: each route's cap, outputs, conversations and lists as
vLLM's request model reads them, named by the field table; media on the parsed body."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.accounting.fieldkinds import Reads
from proxy.limits.reading import choices, completion_cap, conversations, each, media, reading


@pytest.mark.parametrize(
    ("operation", "payload", "cap"),
    [
        ("chat", {"max_completion_tokens": 5, "max_tokens": 9}, 5),
        ("chat", {"max_completion_tokens": None, "max_tokens": 9}, 9),
        ("chat", {"max_output_tokens": 1}, None),
        ("completions", {}, 16),
        ("completions", {"max_tokens": None}, None),
        ("completions", {"max_completion_tokens": 1, "max_tokens": 250}, 250),
        ("responses", {"max_tokens": 1}, None),
        ("responses", {"max_output_tokens": "7"}, 7),
        ("messages", {"max_tokens": 250, "max_completion_tokens": 1}, 250),
        ("generate", {"max_tokens": 1, "sampling_params": {"max_tokens": 250}}, 250),
        ("generate", {"max_tokens": 1}, None),
    ],
)
def test_the_cap_is_the_field_the_route_reads(
    operation: str, payload: dict[str, Any], cap: int | None
) -> None:
    """One field per route (chat: max_completion_tokens, else max_tokens), its default
    when absent (completions: 16), null as no cap; other routes' fields are ignored."""
    assert completion_cap(operation, payload) == cap


def test_the_table_names_a_cap_for_every_generating_route() -> None:
    """Every generating operation has a cap the pricing reads (a field or SamplingParams)."""
    for operation in ("chat", "completions", "responses", "messages", "generate"):
        assert reading(operation, Reads.CAP) or reading(operation, Reads.SAMPLING), operation


def test_outputs_are_the_largest_multiplier() -> None:
    """``n`` and ``best_of`` (the largest), or generate's ``sampling_params.n``; a field
    the route lacks counts nothing."""
    assert choices("completions", {"n": 2, "best_of": "3"}) == 3
    assert choices("generate", {"n": 9, "sampling_params": {"n": 4}}) == 4
    assert choices("messages", {"n": 9}) == 1


def test_conversations_and_lists() -> None:
    """A list of conversations is one engine request each; one conversation is one; Cohere's
    lists by name."""
    talk = [{"role": "user", "content": "hi"}]
    assert conversations("chat", {"messages": [talk, talk]}) == [talk, talk]
    assert conversations("chat", {"messages": talk}) == [talk]
    assert conversations("classify", {"messages": talk}) is None
    assert each("embeddings", {"texts": ["a", "b"], "images": "x"}) == {
        "texts": ["a", "b"],
        "images": ["x"],
    }


def test_media_is_found_as_a_json_parser_reads_it() -> None:
    """An escaped member name is the plain one once parsed; a typed part, or a media member
    without a type, is one part each."""
    raw = b'{"content": [{"type": "\\u0069mage_url", "\\u0069mage_url": {"url": "u"}}]}'
    assert media(json.loads(raw)) == 1
    parts = [{"type": "input_image"}, {"input_audio": {}}, {"type": "text", "text": "image"}]
    assert media({"input": [{"content": parts}]}) == 2
