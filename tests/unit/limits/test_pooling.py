"""Prices of pooling and generative scoring: one engine request per input or item."""

from __future__ import annotations

import pytest

from proxy.limits.limiter import Cost
from proxy.limits.pooling import generative_scoring_cost, pooling_cost
from proxy.tokenizers.hf import HFTokenizer


def test_cohere_lists_are_counted_per_member(minilm: HFTokenizer) -> None:
    """/v2/embed's texts counted one by one; images and input parts at the context."""
    texts = minilm.lengths(["hello there", "hi"], max_length=None)
    assert pooling_cost("embeddings", {"texts": ["hello there", "hi"]}, 256, minilm) == (
        Cost(sum(texts)),
        True,
    )
    assert pooling_cost("embeddings", {"images": ["a", "b"]}, 256, minilm) == (Cost(512), False)


def test_a_list_of_conversations_is_a_context_each() -> None:
    """Embeddings' ``messages`` holding conversations: each rendered, up to the context."""
    talk = [{"role": "user", "content": "hi"}]
    assert pooling_cost("embeddings", {"messages": [talk] * 3}, 100, None) == (Cost(300), False)
    assert pooling_cost("classify", {"messages": talk}, 100, None) == (Cost(100), False)


TALK = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("operation", ["embeddings", "classify", "pooling"])
@pytest.mark.parametrize(
    "messages", [[], [{"content": "x"}], "a string", TALK, [TALK, TALK]], ids=repr
)
def test_a_body_with_messages_and_input_pays_the_larger_reading(
    minilm: HFTokenizer, operation: str, messages: object
) -> None:
    """vLLM's union reads ``input`` when ``messages`` is no conversation (``[]``, a message
    without a role, a string; a batch on classify and pooling: checked on 0.29.0 and
    0.32.0), else the conversation: priced at the larger reading, whichever vLLM picks
    (400 texts were priced as one conversation)."""
    inputs = {"input": ["hello there"] * 400}
    alone = pooling_cost(operation, inputs, 256, minilm)
    talks = pooling_cost(operation, {"messages": messages}, 256, minilm)
    assert alone is not None
    assert talks is not None
    both = {**inputs, "messages": messages}
    larger = max(alone[0].prompt, talks[0].prompt)
    assert pooling_cost(operation, both, 256, minilm) == (Cost(larger), False)
    counted = pooling_cost(operation, both, 256, minilm, counted=9)
    assert counted == (Cost(max(alone[0].prompt, 9)), False)


@pytest.mark.parametrize("member", ["texts", "images", "inputs"])
def test_a_cohere_list_beside_input_pays_the_larger_reading(
    minilm: HFTokenizer, member: str
) -> None:
    """``/v1/embeddings`` and ``/v2/embed`` share the operation, not the request model:
    OpenAI's reads ``input`` and ignores Cohere's lists, Cohere's reads its lists and
    ignores ``input``. A body with both is priced at the larger reading (400 inputs beside
    ``texts: ["x"]`` were priced as one short text)."""
    inputs = {"input": ["hello there"] * 400}
    alone = pooling_cost("embeddings", inputs, 256, minilm)
    listed = pooling_cost("embeddings", {member: ["x"]}, 256, minilm)
    assert alone is not None
    assert listed is not None
    both = pooling_cost("embeddings", {**inputs, member: ["x"]}, 256, minilm)
    assert both == (Cost(max(alone[0].prompt, listed[0].prompt)), False)


def test_cohere_lists_are_not_cut_by_openais_truncation(minilm: HFTokenizer) -> None:
    """``truncate_prompt_tokens`` is OpenAI's field: Cohere's request model has none (it
    ignores it) and truncates by ``truncate`` and ``max_tokens``, which only lower the
    work. /v2/embed's texts are counted whole, at most the context (they were cut to 1)."""
    texts = ["hello there, how are you today"] * 3
    whole = pooling_cost("embeddings", {"texts": texts}, 256, minilm)
    cut = pooling_cost("embeddings", {"texts": texts, "truncate_prompt_tokens": 1}, 256, minilm)
    assert whole is not None
    assert whole[0].prompt > 3
    assert cut == whole


def test_inputs_the_proxy_cannot_read_have_no_price() -> None:
    """A plugin's ``data`` (or no input): None, refused under a budget."""
    assert pooling_cost("pooling", {"data": {"x": 1}}, 100, None) is None


def test_generative_scoring_is_one_request_per_item(minilm: HFTokenizer) -> None:
    """Each item: the query and the item cut to the context less one, one token out."""
    query, item = minilm.lengths(["a query", "an item"], max_length=None)
    payload = {"query": "a query", "items": ["an item"] * 3, "label_token_ids": [1]}
    assert generative_scoring_cost(payload, 256, minilm) == (Cost(3 * (query + item), 3), True)
    ids = {"query": [1] * 10, "items": [[2] * 10], "label_token_ids": [1]}
    assert generative_scoring_cost(ids, 12, None) == (Cost(11, 1), True)
    assert generative_scoring_cost({"query": "q", "items": []}, 12, None) is None
