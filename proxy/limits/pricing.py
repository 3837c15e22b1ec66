"""What a request may cost the engine, known before it is forwarded: exact where the
proxy can count it as vLLM will, else a stated upper bound (docs/metering.md, "Limits").

Scoring: the recount's engine prompt count; with an input the proxy cannot count (an
image), every sequence at the model's whole context. Pooling (embeddings, pooling,
classify): each text input counted with the model's tokenizer (special tokens added), each
token-id input by its length, capped by ``truncate_prompt_tokens`` and the context; an
input the proxy cannot count, at the whole context. Generation: the prompt exactly when it
is token ids, else at most one token per byte of the body (the whole context when the body
names images, audio or video), and the completion reservation: ``max_tokens`` (or its
endpoint's name for it) times ``n``, else what the context leaves.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, TypeGuard

from pydantic import TypeAdapter, ValidationError

from proxy.accounting.analysis import Analysis
from proxy.accounting.dispatch import copies
from proxy.accounting.types import ServedModel, Tokenizer
from proxy.limits.limiter import Cost

POOLING = frozenset({"embeddings", "pooling", "classify"})
GENERATION = frozenset({"chat", "completions", "responses", "messages", "generate"})
# Members that carry a completion's cap, by endpoint family (vLLM's request models).
COMPLETION_CAPS = ("max_completion_tokens", "max_tokens", "max_output_tokens")
MEDIA = (b"image", b"audio", b"video")
UNCAPPED = "no completion cap: what the context leaves"
# What a request the proxy cannot price reserves: a token of each kind, so a spent budget
# refuses it while a budget with room admits it (it settles to what its record bills).
UNPRICED = Cost(1, 1)
# A structured decision's read generates at most two tokens (vLLM 0.32.0, strategies.py:
# max_tokens=1, the diffusion canvas 2).
DECISION_REPLY = 2
_LAX_INT: TypeAdapter[int] = TypeAdapter(int)


@dataclass(frozen=True, slots=True)
class Price:
    """A request's reservation, and whether it is exact or a bound (and which)."""

    cost: Cost
    rule: str
    exact: bool = False
    # A generation without max_tokens: its completion is priced at what the context leaves.
    uncapped: bool = False


def price_scoring(analysis: Analysis | None) -> Price:
    """A scoring request: the recount, or a bound when it has an input not counted."""
    if analysis is not None and analysis.counted and analysis.counted.recount:
        return Price(Cost(analysis.counted.recount.engine), "recount", exact=True)
    request = analysis.request if analysis else None
    model = analysis.model if analysis else None
    if request is None or model is None or model.max_model_len <= 0:
        return Price(UNPRICED, "unpriced: the request could not be read")
    sequences = len(request.queries) + len(request.documents)
    return Price(Cost(sequences * model.max_model_len), "bound: every sequence at the context")


def price_metered(
    operation: str,
    body: bytes,
    model: ServedModel | None,
    tokenizer: Tokenizer | None,
    *,
    counted_prompt: int | None = None,
) -> Price:
    """A metered request (runs in a tokenizer thread when ``tokenizer`` is given).

    ``counted_prompt``: the exact total prompt tokens of a text generation request's
    prompts as vLLM renders them (its chat template applied), counted by the caller; it
    replaces the byte bound, and the prompt part of the price is then exact."""
    try:
        payload = json.loads(body)
    except ValueError:
        payload = None
    if not isinstance(payload, dict) or model is None or model.max_model_len <= 0:
        return Price(UNPRICED, "unpriced: unknown model or unreadable body")
    context = model.max_model_len
    if operation in POOLING:
        return _pooling(payload, context, tokenizer)
    if operation in GENERATION:
        return _generation(operation, payload, body, context, counted_prompt)
    if operation == "decisions":
        return _decisions(payload, body, context)
    return Price(UNPRICED, f"unpriced: {operation}")


def _decisions(payload: dict[str, Any], body: bytes, context: int) -> Price:
    """Structured decisions (``/v1/systemone``: questions by name; ``/v1/decisions``, 0.33+:
    a list): at most one engine request per question (``ReadStrategy.num_requests``), each
    a prompt within the context that holds the state, the instructions and the question (at
    most one token per byte of the body, as a chat), and a reply of at most
    ``DECISION_REPLY`` tokens."""
    questions = payload.get("questions")
    reads = len(questions) if isinstance(questions, dict | list) else 0
    if reads == 0:  # vLLM refuses it (400)
        return Price(UNPRICED, "unpriced: a decision with no questions")
    each = context if any(m in body for m in MEDIA) else min(len(body), context)
    return Price(Cost(each * reads, DECISION_REPLY * reads), "bound: one read per question")


def _pooling(payload: dict[str, Any], context: int, tokenizer: Tokenizer | None) -> Price:
    inputs = payload.get("input")
    if inputs is None or "messages" in payload:
        return Price(Cost(context), "bound: a chat input at the context")
    items = inputs if isinstance(inputs, list) and not _ids(inputs) else [inputs]
    cap = _truncation(payload.get("truncate_prompt_tokens"), context)
    texts = [x for x in items if isinstance(x, str)]
    counted = tokenizer.lengths(texts, max_length=None) if tokenizer and texts else []
    exact, total, at = tokenizer is not None or not texts, 0, 0
    for item in items:
        if isinstance(item, str) and tokenizer is not None:
            length, at = counted[at], at + 1
        elif _ids(item):
            length = len(item)
        else:
            length, exact = context, False
        total += min(length, cap)
    return Price(
        Cost(total), "count" if exact else "bound: inputs not counted at the context", exact=exact
    )


def _generation(
    operation: str, payload: dict[str, Any], body: bytes, context: int, counted: int | None
) -> Price:
    prompts = _prompt_ids(payload)
    texts = _text_prompts(payload)
    count = len(prompts) if prompts else texts
    if prompts is not None:
        prompt, exact = sum(min(len(p), context) for p in prompts), True
    elif counted is not None:
        prompt, exact = counted, True
    elif any(m in body for m in MEDIA) or payload.get("previous_response_id") is not None:
        # media, or a stored conversation re-read (Responses): each prompt up to the context
        prompt, exact = context * count, False
    else:
        prompt, exact = min(len(body), context * count), False
    params = payload.get("sampling_params")
    params = params if isinstance(params, dict) else {}
    cap = next((_lax(payload.get(k)) for k in COMPLETION_CAPS if _lax(payload.get(k))), None)
    cap = cap if cap is not None else _lax(params.get("max_tokens"))
    shortest = min((len(p) for p in prompts), default=0) if prompts else 0
    left = max(context - shortest, 0)
    completion = min(cap, left) if cap is not None else left
    choices = copies(operation, payload) * count
    if not exact:  # vLLM refuses a prompt that leaves no room for max_tokens
        prompt = min(prompt, max(context - completion, 1) * count)
    rule = "prompt ids" if exact else "prompt bound"
    if cap is None:
        return Price(Cost(prompt, completion * choices), f"{rule} + {UNCAPPED}", uncapped=True)
    return Price(Cost(prompt, completion * choices), f"{rule} + completion cap")


def _lax(value: Any) -> int | None:
    """``value`` as vLLM's models read a count (``8``, ``"8"``, ``8.0``), or None when it
    is absent or no count (vLLM refuses such a request, 400)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        count = _LAX_INT.validate_python(value)
    except ValidationError:
        return None
    return count if count >= 0 else None


def _text_prompts(payload: dict[str, Any]) -> int:
    """How many text prompts a completion's ``prompt`` holds (a list is a batch)."""
    value = payload.get("prompt")
    return len(value) if isinstance(value, list) and value else 1


def _prompt_ids(payload: dict[str, Any]) -> list[list[int]] | None:
    """Prompts given as token ids (one, or a batch): counted by their lengths."""
    for name in ("prompt", "token_ids", "prompt_token_ids"):
        value = payload.get(name)
        if _ids(value):
            return [list(value)]
        if isinstance(value, list) and value and all(_ids(v) for v in value):
            return [list(v) for v in value]
    return None


def _ids(value: Any) -> TypeGuard[list[int]]:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    )


def _truncation(value: Any, context: int) -> int:
    """vLLM's ``truncate_prompt_tokens``: k keeps the last k tokens, -1 the context."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return min(value, context)
    return context
