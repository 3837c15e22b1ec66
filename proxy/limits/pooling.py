"""Prices of the routes whose engine requests each read an input and make at most one
token: pooling (embeddings, Cohere's /v2/embed, classify, pooling) and generative scoring.
Each input is one engine request, counted with the model's tokenizer where the proxy can,
else bounded (docs/metering.md, "Prices before forwarding")."""

from __future__ import annotations

from typing import Any, TypeGuard

from proxy.accounting.operations import Operation
from proxy.accounting.types import Tokenizer
from proxy.limits.limiter import Cost
from proxy.limits.reading import conversations, each, media


def is_ids(value: Any) -> TypeGuard[list[int]]:
    """A token-id prompt: a non-empty list of ints."""
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    )


def truncation(value: Any, context: int) -> int:
    """vLLM's ``truncate_prompt_tokens``: k keeps the last k tokens, -1 the context."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return min(value, context)
    return context


def lengths(items: list[Any], context: int, tokenizer: Tokenizer | None) -> tuple[list[int], bool]:
    """Each input's tokens, at most the context: a text counted by ``tokenizer`` (special
    tokens added), token ids by their length, anything else (media, a part list) at the
    whole context. Whether every one was counted."""
    texts = [x for x in items if isinstance(x, str)]
    counted = iter(tokenizer.lengths(texts, max_length=None) if tokenizer and texts else [])
    out, exact = [], True
    for item in items:
        if isinstance(item, str) and tokenizer is not None:
            out.append(min(next(counted), context))
        elif is_ids(item):
            out.append(min(len(item), context))
        else:
            out.append(context)
            exact = False
    return out, exact


def pooling_cost(
    operation: Operation,
    payload: dict[str, Any],
    context: int,
    tokenizer: Tokenizer | None,
    counted: int | None = None,
) -> tuple[Cost, bool] | None:
    """A pooling request's prompt tokens and whether they are exact; None when the proxy
    cannot read its inputs (a plugin's ``data``, no input at all). ``counted``: its one
    conversation's tokens as ``/tokenize`` counted them.

    vLLM reads a body through a union of a chat and a completion variant (pydantic's smart
    mode, extra fields allowed): a body with both ``messages`` and ``input`` is read as a
    conversation when ``messages`` validates as one, else by its ``input`` (0.29.0 and
    0.32.0 alike; ``[]`` or a message without a role reads ``input``). ``/v1/embeddings``
    and Cohere's ``/v2/embed`` share the operation, not the request model: OpenAI's reads
    ``input`` and ignores Cohere's lists, Cohere's reads its lists and ignores ``input``
    and ``truncate_prompt_tokens``. The proxy does not redo either choice: a body with
    more than one reading is priced at the larger."""
    cap = truncation(payload.get("truncate_prompt_tokens"), context)
    readings = [
        found
        for found in (
            _conversations_cost(operation, payload, cap, counted),
            _lists_cost(operation, payload, context, tokenizer),
            _input_cost(payload, context, cap, tokenizer),
        )
        if found is not None
    ]
    if len(readings) > 1:
        return Cost(max(cost.prompt for cost, _ in readings)), False
    return readings[0] if readings else None


def _conversations_cost(
    operation: Operation, payload: dict[str, Any], cap: int, counted: int | None
) -> tuple[Cost, bool] | None:
    """Each conversation rendered: its count, else up to the context (``cap``)."""
    if counted is not None:
        return Cost(counted), True
    talks = conversations(operation, payload)
    if talks is None and "messages" in payload:  # classify, pooling: one conversation
        talks = [payload["messages"]]
    return None if talks is None else (Cost(len(talks) * cap), False)


def _lists_cost(
    operation: Operation, payload: dict[str, Any], context: int, tokenizer: Tokenizer | None
) -> tuple[Cost, bool] | None:
    """Cohere's lists (``/v2/embed``): texts counted, images and input parts at the
    context, each at most the context (its model has no ``truncate_prompt_tokens``)."""
    lists = each(operation, payload)
    if not lists:
        return None
    total, exact = 0, True
    for name, items in lists.items():
        texts = items if name == "texts" else [None] * len(items)
        counted, whole = lengths(texts, context, tokenizer)
        total, exact = total + sum(counted), exact and whole
    return Cost(total), exact


def _input_cost(
    payload: dict[str, Any], context: int, cap: int, tokenizer: Tokenizer | None
) -> tuple[Cost, bool] | None:
    """``input``: texts counted, token ids by length, media at the context, each at most
    ``cap``."""
    inputs = payload.get("input")
    if inputs is None:
        return None
    items = inputs if isinstance(inputs, list) and not is_ids(inputs) else [inputs]
    counted, exact = lengths(items, context, tokenizer)
    exact = exact and not media(items)
    return Cost(sum(min(n, cap) for n in counted)), exact


def generative_scoring_cost(
    payload: dict[str, Any], context: int, tokenizer: Tokenizer | None
) -> tuple[Cost, bool] | None:
    """``/generative_scoring`` (0.20+): one engine request per item, its prompt the query
    and the item cut to the context less one, one generated token (``max_tokens=1``).
    Texts counted with special tokens (vLLM adds none to an item: at most their count
    over), or bounded by their UTF-8 bytes when no tokenizer is at hand."""
    items, query = payload.get("items"), payload.get("query")
    if not isinstance(items, list) or not items or not (isinstance(query, str) or is_ids(query)):
        return None
    counted, exact = _bounded([query, *items], context, tokenizer)
    first, rest = counted[0], counted[1:]
    prompt = sum(min(first + n, context - 1) for n in rest)
    return Cost(prompt, len(items)), exact


def _bounded(items: list[Any], context: int, tokenizer: Tokenizer | None) -> tuple[list[int], bool]:
    if tokenizer is not None:
        return lengths(items, context, tokenizer)
    out = [len(x) if is_ids(x) else len(str(x).encode()) + 2 for x in items]
    return out, all(is_ids(x) for x in items)
