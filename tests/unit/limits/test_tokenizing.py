"""What the upstream's /tokenize is asked for each chat-like route's prompt (the messages
vLLM 0.32.0 builds from the body), and the count read back from its answers."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.accounting.types import Release
from proxy.limits.tokenizing import counted, tokenize_requests

NEW, OLD = Release("0.32.0"), Release("0.8.5")
HI = [{"role": "user", "content": "hi"}]
IMAGE = {"type": "image_url", "image_url": {"url": "http://example.invalid/a.png"}}


def asked(operation: str, payload: dict[str, Any], release: Release = NEW) -> list[Any]:
    return [json.loads(b) for b in tokenize_requests(operation, payload, release)]


def test_a_chat_is_asked_with_its_template_fields() -> None:
    """The messages, tools and template fields go as they are; documents and
    reasoning_effort reach the template kwargs as the chat route passes them."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    payload = {
        "model": "gen",
        "messages": HI,
        "tools": tools,
        "max_tokens": 5,
        "add_generation_prompt": False,
        "continue_final_message": True,
        "chat_template_kwargs": {"x": 1},
        "reasoning_effort": "none",
        "documents": [{"text": "d"}],
    }
    (request,) = asked("chat", payload)
    assert request == {
        "model": "gen",
        "messages": HI,
        "tools": tools,
        "add_generation_prompt": False,
        "continue_final_message": True,
        "chat_template_kwargs": {
            "x": 1,
            "documents": [{"text": "d"}],
            "reasoning_effort": "none",
            "enable_thinking": False,
        },
    }


def test_each_conversation_of_a_batch_is_asked_apart() -> None:
    """/v1/chat/completions/batch: one /tokenize per conversation."""
    payload = {"messages": [HI, [*HI, {"role": "assistant", "content": "yo"}]]}
    assert [len(r["messages"]) for r in asked("chat", payload)] == [1, 2]


@pytest.mark.parametrize(
    ("operation", "payload", "release"),
    [
        ("chat", {"messages": [{"role": "user", "content": [IMAGE]}]}, NEW),
        ("chat", {"messages": HI, "tools": [{"type": "function"}]}, OLD),
        ("chat", {"messages": HI, "chat_template_kwargs": "x"}, NEW),
        ("chat", {"messages": "hi"}, NEW),
        ("completions", {"prompt": [1, 2, 3]}, NEW),
        ("completions", {"prompt": "a", "prompt_embeds": "AAAA"}, NEW),
        ("responses", {"input": "hi", "previous_response_id": "resp_1"}, NEW),
        ("responses", {"input": "hi", "tools": [{"type": "function", "name": "f"}]}, NEW),
        ("responses", {"input": [{"type": "function_call_output", "output": "x"}]}, NEW),
        ("responses", {"input": [{"role": "assistant", "content": "partial"}]}, NEW),
        ("messages", {"messages": HI, "thinking": {"type": "enabled"}}, NEW),
        ("messages", {"messages": [{"role": "user", "content": [{"type": "image"}]}]}, NEW),
        ("messages", {"messages": [{"role": "system", "content": "inline"}]}, NEW),
        ("embeddings", {"input": "text"}, NEW),
        ("generate", {"token_ids": [1, 2]}, NEW),
    ],
)
def test_prompts_it_cannot_render_as_the_route_are_not_asked(
    operation: str, payload: dict[str, Any], release: Release
) -> None:
    """Media (which /tokenize would fetch), tools before 0.32, token ids, stored
    conversations, tool items and unreadable fields: no request, the byte bound stays."""
    assert asked(operation, payload, release) == []


REUSED = {"prompt_token_ids": list(range(1000))}


@pytest.mark.parametrize(
    ("operation", "payload"),
    [
        ("chat", {"messages": HI, "kv_transfer_params": REUSED}),
        ("responses", {"input": "hi", "kv_transfer_params": REUSED}),
        ("messages", {"messages": HI, "max_tokens": 1, "kv_transfer_params": REUSED}),
    ],
)
def test_a_prompt_forwarded_as_token_ids_is_not_asked(operation: str, payload: Any) -> None:
    """vLLM 0.32.0 feeds ``kv_transfer_params.prompt_token_ids`` to the engine instead of
    the rendered messages (``_reused_prompt_token_ids``, on any server): counting the
    messages would price 1,000 prompt tokens as a few. Not asked: the byte bound stays."""
    assert asked(operation, payload) == []


def test_a_completion_with_a_suffix_is_not_asked() -> None:
    """A ``suffix`` is rendered into the prompt (fill-in-the-middle: prompt, hole, suffix)
    by renderers that have FIM; /tokenize has no suffix, so the prompt alone would count
    less than the engine reads."""
    assert asked("completions", {"prompt": "def f(", "suffix": "x" * 4000}) == []


@pytest.mark.parametrize(
    "extra",
    [
        {"response_format": {"type": "json_schema", "json_schema": {"name": "s"}}},
        {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required"},
        {
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": "f"}},
        },
    ],
)
def test_a_chat_whose_template_reads_what_tokenize_lacks_is_not_asked(
    extra: dict[str, Any],
) -> None:
    """Kimi K3's renderer (``renderers/kimi_k3.py``) renders ``response_format`` and a
    tool choice other than auto/none into the prompt, and /tokenize carries neither."""
    assert asked("chat", {"messages": HI, **extra}) == []


def test_responses_with_previous_input_messages_are_not_asked() -> None:
    """A Harmony model (gpt-oss) renders ``previous_input_messages`` ahead of the input
    (``construct_harmony_previous_input_messages``): history /tokenize is never shown."""
    history = [{"role": "user", "content": "x" * 4000}]
    assert asked("responses", {"input": "hi", "previous_input_messages": history}) == []


def test_completions_ask_each_text_prompt() -> None:
    """A batch of text prompts is one /tokenize each, special tokens as the request says."""
    payload = {"model": "gen", "prompt": ["a", "b c"], "add_special_tokens": False}
    assert asked("completions", payload) == [
        {"model": "gen", "add_special_tokens": False, "prompt": "a"},
        {"model": "gen", "add_special_tokens": False, "prompt": "b c"},
    ]


def test_responses_become_the_messages_vllm_builds() -> None:
    """Instructions first as a system message, a string input as the user's; message
    items as they are (input_text parts as text), an assistant's as its first text
    (construct_input_messages)."""
    (request,) = asked("responses", {"instructions": "be brief", "input": "hi"})
    assert request["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]
    said = {"role": "assistant", "content": [{"type": "output_text", "text": "yo"}]}
    user = {"role": "user", "content": [{"type": "input_text", "text": "and?"}]}
    (request,) = asked("responses", {"input": [user, said, user]})
    text = {"role": "user", "content": [{"type": "text", "text": "and?"}]}
    assert request["messages"] == [text, {"role": "assistant", "content": "yo"}, text]


def test_responses_are_counted_with_the_special_tokens_their_route_adds() -> None:
    """vLLM 0.32.0's ``ResponsesRequest.build_tok_params`` leaves ``add_special_tokens`` at
    TokenizeParams' default, true: the rendered prompt gets the tokenizer's special tokens
    (a second BOS on Llama 3), which /tokenize's chat default (false) leaves out. The chat
    and Messages routes add none (ChatCompletionRequest's default, false)."""
    (request,) = asked("responses", {"input": "hi"})
    assert request["add_special_tokens"] is True
    (request,) = asked("messages", {"messages": HI, "max_tokens": 1})
    assert "add_special_tokens" not in request


def test_messages_become_the_chat_vllm_converts_them_to() -> None:
    """The system blocks joined (the billing header dropped), one text block as a string,
    several as parts."""
    payload = {
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: 1"},
            {"type": "text", "text": "a"},
            {"type": "text", "text": "b"},
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "one"}]},
            {"role": "assistant", "content": "two"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "3"}, {"type": "text", "text": "4"}],
            },
        ],
    }
    (request,) = asked("messages", payload)
    assert request["messages"] == [
        {"role": "system", "content": "ab"},
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "two"},
        {"role": "user", "content": [{"type": "text", "text": "3"}, {"type": "text", "text": "4"}]},
    ]


def test_a_pooling_conversation_has_no_generation_prompt_unless_asked() -> None:
    """Embeddings given as messages: vLLM's pooling chat defaults add_generation_prompt to
    false, /tokenize to true, so it is said."""
    (request,) = asked("embeddings", {"messages": HI})
    assert request == {"add_generation_prompt": False, "messages": HI}
    (request,) = asked("pooling", {"messages": HI, "add_generation_prompt": True})
    assert request["add_generation_prompt"] is True


def test_counted_sums_the_answers_cut_to_the_truncation() -> None:
    """Each answer's count, each cut to truncate_prompt_tokens when that is positive."""
    answers = [json.dumps({"count": n, "max_model_len": 9, "tokens": []}).encode() for n in (3, 8)]
    assert counted(answers) == 11
    assert counted(answers, 5) == 8
    assert counted(answers, -1) == 11


@pytest.mark.parametrize(
    "raw", [b"not json", b"[]", b'{"count": "3"}', b'{"count": -1}', b'{"count": true}', b"{}"]
)
def test_an_answer_without_a_count_counts_nothing(raw: bytes) -> None:
    """Anything but vLLM's TokenizeResponse: no count (the byte bound stays)."""
    assert counted([b'{"count": 1}', raw]) is None
