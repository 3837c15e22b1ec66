"""Normalisation of every score and rerank request shape (spec section 2)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.accounting.shapes import endpoint_for_path, parse_scoring_request, score_ambiguity
from proxy.accounting.types import Pairing, Truncation

IMAGE = {"content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}


@pytest.mark.parametrize(
    ("endpoint", "body", "queries", "documents", "pairing"),
    [
        ("score", {"text_1": "q", "text_2": "d"}, ("q",), ("d",), Pairing.ONE_TO_ONE),
        ("score", {"text_1": ["q"], "text_2": ["a", "b"]}, ("q",), ("a", "b"), Pairing.ONE_TO_N),
        (
            "score",
            {"data_1": ["a", "b"], "data_2": ["c", "d"]},
            ("a", "b"),
            ("c", "d"),
            Pairing.N_TO_N,
        ),
        ("score", {"queries": "q", "documents": ["a"]}, ("q",), ("a",), Pairing.ONE_TO_ONE),
        ("score", {"queries": "q", "items": ["a", "b"]}, ("q",), ("a", "b"), Pairing.ONE_TO_N),
        (
            "rerank",
            {"query": "q", "documents": ["a", "b"], "top_n": 1},
            ("q",),
            ("a", "b"),
            Pairing.ONE_TO_N,
        ),
        ("rerank", {"query": "q", "documents": "a"}, ("q",), ("a",), Pairing.ONE_TO_ONE),
        ("invocations", {"query": "q", "documents": ["a"]}, ("q",), ("a",), Pairing.ONE_TO_ONE),
        (
            "invocations",
            {"text_1": "q", "text_2": ["a", "b"]},
            ("q",),
            ("a", "b"),
            Pairing.ONE_TO_N,
        ),
        (
            "rerank",
            {"query": "q", "documents": [IMAGE, "b"]},
            ("q",),
            (IMAGE, "b"),
            Pairing.ONE_TO_N,
        ),
        (
            "score",
            {"text_1": ["a", "b", "c"], "text_2": ["x", "y"]},
            ("a", "b", "c"),
            ("x", "y"),
            None,
        ),
        ("rerank", {"query": "q", "documents": []}, ("q",), (), None),
    ],
)
def test_shapes(
    endpoint: str,
    body: dict[str, Any],
    queries: tuple[Any, ...],
    documents: tuple[Any, ...],
    pairing: Pairing | None,
) -> None:
    """Each spelling normalises to queries, documents and a pairing (None: vLLM says 400)."""
    request = parse_scoring_request(endpoint, body)
    assert request is not None
    assert (request.queries, request.documents, request.pairing) == (queries, documents, pairing)


def test_truncation_fields_and_unknown_fields() -> None:
    """Options that change counts are read; unknown fields are accepted and ignored."""
    body = {
        "model": "m",
        "query": "q",
        "documents": ["d"],
        "truncate_prompt_tokens": -1,
        "truncation_side": "left",
        "max_tokens_per_query": 3,
        "max_tokens_per_doc": 4,
        "padding": "max_length",
        "whatever": {"x": 1},
    }
    request = parse_scoring_request("rerank", body)
    assert request is not None
    assert request.model == "m"
    assert request.truncation == Truncation(-1, "left", 3, 4, True)


@pytest.mark.parametrize(
    "body",
    [
        None,
        [],
        "text",
        {"query": 5, "documents": ["d"]},
        {"text_1": "q"},
        {"query": "q", "documents": ["d"], "truncation_side": "middle"},
        {"query": "q", "documents": ["d"], "top_n": "x"},
    ],
)
def test_unparseable_bodies(body: Any) -> None:
    """What does not validate is not audited (and still forwarded)."""
    assert parse_scoring_request("rerank", body) is None


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/score", "score"),
        ("/v1/score", "score"),
        ("/rerank", "rerank"),
        ("/v1/rerank", "rerank"),
        ("/v2/rerank", "rerank"),
        ("/invocations", "invocations"),
        ("/v1/embeddings", None),
        ("/v2/score", None),
    ],
)
def test_endpoint_for_path(path: str, expected: str | None) -> None:
    """The audited paths and their aliases."""
    assert endpoint_for_path(path) == expected


@pytest.mark.parametrize(
    ("body", "unclear"),
    [
        ({"queries": "q", "documents": ["d"], "text_1": "q", "text_2": ["d"]}, True),
        ({"queries": "q", "documents": ["d"], "items": ["d"]}, True),
        ({"data_1": "q", "data_2": "d", "text_1": "q", "text_2": "d"}, True),
        ({"queries": "q", "documents": ["d"], "text_1": "q"}, False),  # one whole pair
        ({"text_1": "q", "text_2": [{"content": [{"type": "text", "text": "queries"}]}]}, False),
        ({"text_1": "q", "text_2": ['"queries": "documents": "items":']}, False),  # in a text
    ],
)
def test_a_score_body_with_two_whole_input_pairs_is_ambiguous(
    body: dict[str, Any], unclear: bool
) -> None:
    """vLLM reads the first pair of its union that validates; two whole pairs are the
    proxy's to refuse, whatever the pair names inside the texts."""
    assert (score_ambiguity(json.dumps(body).encode()) is not None) is unclear
