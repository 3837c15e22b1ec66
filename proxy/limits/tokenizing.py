"""A generation's prompt as vLLM's own ``POST /tokenize`` counts it: the requests that ask
the upstream for it, and the count read back (docs/metering.md, "Prices before forwarding").

``/tokenize`` renders a conversation with the served chat template (``--chat-template``,
``--default-chat-template-kwargs`` and the request's own), its tools and generation
prompt, as the chat route does, and counts it with the served tokenizer: exact by
construction, engine-free. Each route's body is mapped to the messages vLLM itself builds
from it (the Responses and Messages conversions of vLLM 0.32.0's ``responses/utils.py`` and
``anthropic/serving.py``); a body whose prompt this mapping cannot render as the route does
(media, which ``/tokenize`` would fetch; tool calls; a stored conversation) gets ``None``,
and its price keeps the byte bound.
"""

from __future__ import annotations

import json
from typing import Any

from proxy.accounting.operations import POOLING_OPERATIONS, Operation
from proxy.accounting.types import Release
from proxy.limits.pooling import truncation

# Content parts that are text alone (chat; Responses' input_text and output_text).
TEXT_PARTS = frozenset({"text", "input_text", "output_text"})
# ``tools`` reaches the template through /tokenize from this series on (read from the
# wheels: 0.10.2, 0.32.0 and 0.34.0 have it, 0.8.5 not; vLLM PR #18187, after 0.8.5);
# before, a chat with tools is not counted.
TOOLS_SINCE = (0, 10)
# Chat fields /tokenize takes as they are (TokenizeChatRequest, 0.8.5 to 0.34.0).
_CHAT_FIELDS = ("add_generation_prompt", "continue_final_message", "add_special_tokens")
_TEMPLATE_FIELDS = ("chat_template", "chat_template_kwargs", "mm_processor_kwargs")

Request = dict[str, Any]


def tokenize_requests(
    operation: Operation, payload: dict[str, Any], release: Release
) -> list[bytes]:
    """The ``/tokenize`` bodies whose counts sum to ``payload``'s prompt tokens as the
    route renders them; empty when the proxy cannot have them counted so."""
    requests = _requests(operation, payload, release)
    return [json.dumps(r).encode() for r in requests] if requests else []


def _requests(operation: Operation, payload: dict[str, Any], release: Release) -> list[Request]:
    if _forwarded_ids(payload):
        return []
    model = payload.get("model")
    named = {"model": model} if isinstance(model, str) and model else {}
    if operation == Operation.CHAT:
        return _chat(payload, release, named)
    if operation == Operation.COMPLETIONS:
        return _completions(payload, named)
    if operation == Operation.RESPONSES:
        return _responses(payload, named)
    if operation == Operation.MESSAGES:
        return _messages(payload, named)
    if operation in POOLING_OPERATIONS and "messages" in payload:
        return _pooling_chat(payload, named)
    return []


def _chat(payload: dict[str, Any], release: Release, named: Request) -> list[Request]:
    """A chat (or the batch route's conversations): its messages, tools and template
    fields; ``documents`` and ``reasoning_effort`` reach the template as the chat route
    passes them (``ChatCompletionRequest.build_chat_params``). None with a
    ``response_format`` or a tool choice the renderer may render (``kimi_k3.py`` renders
    both; /tokenize has neither field)."""
    tools = payload.get("tools")
    if tools is not None and not (isinstance(tools, list) and release.since(TOOLS_SINCE)):
        return []
    if payload.get("response_format") is not None or (
        tools and payload.get("tool_choice") not in (None, "auto", "none")
    ):
        return []  # Kimi K3's renderer renders them; /tokenize carries neither
    messages = payload.get("messages")
    if not isinstance(messages, list):
        return []
    batch = bool(messages) and all(isinstance(m, list) for m in messages)
    conversations: list[Any] = messages if batch else [messages]
    if not all(_plain(c) for c in conversations):
        return []
    base = {**named, **_copied(payload, _CHAT_FIELDS + _TEMPLATE_FIELDS)}
    kwargs = _template_kwargs(payload.get("chat_template_kwargs"), payload)
    if kwargs is None:
        return []
    if kwargs:
        base["chat_template_kwargs"] = kwargs
    if tools:
        base["tools"] = tools
    return [{**base, "messages": c} for c in conversations]


def _template_kwargs(given: Any, payload: dict[str, Any]) -> dict[str, Any] | None:
    """The chat route's template kwargs: the request's, then ``documents`` and
    ``reasoning_effort`` (and ``enable_thinking`` from it) where set (vLLM's
    ``merge_kwargs``); None when the request's are no object (vLLM refuses it)."""
    if given is not None and not isinstance(given, dict):
        return None
    kwargs = dict(given or {})
    extra = {k: payload.get(k) for k in ("documents", "reasoning_effort")}
    effort = extra["reasoning_effort"]
    if effort is not None and "enable_thinking" not in kwargs:
        extra["enable_thinking"] = effort != "none"
    kwargs.update({k: v for k, v in extra.items() if v not in (None, "auto")})
    return kwargs


def _completions(payload: dict[str, Any], named: Request) -> list[Request]:
    """Text prompts, each counted with the special tokens the route adds; none with a
    ``suffix`` (a FIM renderer renders prompt, hole and suffix; /tokenize the prompt)."""
    if payload.get("prompt_embeds") is not None or payload.get("suffix") is not None:
        return []
    prompt = payload.get("prompt")
    prompts = prompt if isinstance(prompt, list) and prompt else [prompt]
    if not all(isinstance(p, str) for p in prompts):
        return []
    special = _copied(payload, ("add_special_tokens",))
    return [{**named, **special, "prompt": p} for p in prompts]


def _responses(payload: dict[str, Any], named: Request) -> list[Request]:
    """vLLM's ``construct_input_messages``: the instructions as a system message, then the
    input (a string as one user message; message items as they are, an assistant's as its
    first text). Tools, reasoning, a stored conversation, Harmony's previous input
    messages and other items: not counted."""
    unread = ("tools", "previous_response_id", "previous_input_messages", "reasoning")
    if any(payload.get(k) is not None for k in unread):
        return []
    messages: list[Any] = []
    instructions = payload.get("instructions")
    if instructions:
        if not isinstance(instructions, str):
            return []
        messages.append({"role": "system", "content": instructions})
    given = payload.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list) and given and all(_response_item(i) for i in given):
        if given[-1].get("role") == "assistant":  # continued as a partial message
            return []
        messages.extend(_response_message(i) for i in given)
    else:
        return []
    kwargs = _template_kwargs(payload.get("chat_template_kwargs"), {})
    if kwargs is None:
        return []
    extra = {"chat_template_kwargs": kwargs} if kwargs else {}
    # the route tokenizes the rendered prompt with special tokens (TokenizeParams' default)
    return [{**named, **extra, "add_special_tokens": True, "messages": messages}]


def _response_item(item: Any) -> bool:
    return (
        isinstance(item, dict)
        and item.get("role") in ("user", "system", "developer", "assistant")
        and item.get("type", "message") == "message"
        and _plain_content(item.get("content"))
    )


def _response_message(item: dict[str, Any]) -> dict[str, Any]:
    """An item as the route renders it; its ``input_text`` parts as the ``text`` parts
    /tokenize's message model takes (vLLM's parser reads both alike)."""
    content = item.get("content")
    if not isinstance(content, list) or not content:
        return item
    if item.get("role") == "assistant":
        return {"role": "assistant", "content": content[0].get("text")}
    parts = [{"type": "text", "text": p.get("text")} for p in content]
    return {**item, "content": parts}


def _messages(payload: dict[str, Any], named: Request) -> list[Request]:
    """The Messages API as vLLM converts it (``to_chat_completion_request``): the system
    text joined into one system message, each turn's text (one text block as a string).
    Tools, thinking, output settings, inline system turns and other blocks: not counted."""
    unread = ("tools", "tool_choice", "thinking", "output_config")
    if any(payload.get(k) is not None for k in unread):
        return []
    messages: list[Any] = []
    system = _system_text(payload.get("system"))
    if system is None:
        return []
    if system:
        messages.append({"role": "system", "content": system})
    turns = payload.get("messages")
    if not isinstance(turns, list) or not turns:
        return []
    for turn in turns:
        converted = _turn(turn)
        if converted is None:
            return []
        messages.append(converted)
    kwargs = _template_kwargs(payload.get("chat_template_kwargs"), {})
    if kwargs is None:
        return []
    extra = {"chat_template_kwargs": kwargs} if kwargs else {}
    return [{**named, **extra, "messages": messages}]


def _system_text(system: Any) -> str | None:
    if system is None or isinstance(system, str):
        return system or ""
    if not isinstance(system, list) or not all(_text_block(b) for b in system):
        return None
    texts = [b["text"] for b in system if b["text"]]
    return "".join(t for t in texts if not t.startswith("x-anthropic-billing-header"))


def _turn(turn: Any) -> dict[str, Any] | None:
    if not isinstance(turn, dict) or turn.get("role") not in ("user", "assistant"):
        return None
    content = turn.get("content")
    if isinstance(content, str):
        return {"role": turn["role"], "content": content}
    if not isinstance(content, list) or not content or not all(_text_block(b) for b in content):
        return None
    parts = [{"type": "text", "text": b["text"]} for b in content]
    return {"role": turn["role"], "content": parts[0]["text"] if len(parts) == 1 else parts}


def _text_block(block: Any) -> bool:
    return (
        isinstance(block, dict)
        and block.get("type") == "text"
        and isinstance(block.get("text"), str)
    )


def _pooling_chat(payload: dict[str, Any], named: Request) -> list[Request]:
    """A pooling request given as a conversation: rendered without a generation prompt
    unless it asks for one (``add_generation_prompt`` defaults to false there)."""
    messages = payload.get("messages")
    if not _plain(messages):
        return []
    fields = _copied(payload, _CHAT_FIELDS + _TEMPLATE_FIELDS)
    return [{**named, "add_generation_prompt": False, **fields, "messages": messages}]


def _plain(messages: Any) -> bool:
    """A conversation of text alone (no media part that /tokenize would fetch)."""
    return (
        isinstance(messages, list)
        and bool(messages)
        and all(isinstance(m, dict) and _plain_content(m.get("content")) for m in messages)
    )


def _plain_content(content: Any) -> bool:
    if content is None or isinstance(content, str):
        return True
    return isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") in TEXT_PARTS for p in content
    )


def _forwarded_ids(payload: dict[str, Any]) -> bool:
    """Prompt token ids forwarded for decode-side reuse: vLLM 0.32.0 feeds them to the
    engine instead of the rendered messages (chat, Responses and Messages, on any server:
    ``renderers/online_renderer.py`` ``_reused_prompt_token_ids``), so the messages'
    count says nothing of the engine's prompt."""
    params = payload.get("kv_transfer_params")
    return isinstance(params, dict) and params.get("prompt_token_ids") is not None


def _copied(payload: dict[str, Any], names: tuple[str, ...]) -> Request:
    return {k: payload[k] for k in names if payload.get(k) is not None}


def route_truncation(operation: Operation, payload: dict[str, Any]) -> Any:
    """``truncate_prompt_tokens`` where the route's request model reads it (chat, its
    batch, completions, pooling); vLLM's Messages request drops it and Responses truncates
    by ``truncation`` alone, so there it cuts nothing."""
    if operation in (Operation.CHAT, Operation.COMPLETIONS) or operation in POOLING_OPERATIONS:
        return payload.get("truncate_prompt_tokens")
    return None


def counted(answers: list[bytes], cut: Any = None) -> int | None:
    """The prompt tokens ``/tokenize``'s answers count (each cut to ``cut``, vLLM's
    ``truncate_prompt_tokens``, when that is a positive count: ``pooling.truncation``);
    None when an answer is not vLLM's ``TokenizeResponse``."""
    total = 0
    for raw in answers:
        try:
            answer = json.loads(raw)
        except ValueError:
            return None
        count = answer.get("count") if isinstance(answer, dict) else None
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            return None
        total += truncation(cut, count)
    return total
