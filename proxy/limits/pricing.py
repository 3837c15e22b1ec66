"""What a request may cost the engine, known before it is forwarded: exact where the
proxy can count it as vLLM will, else a stated upper bound (docs/metering.md, "Prices
before forwarding"). Every member that drives the price is read from the parsed body, as
vLLM's request model for the route reads it (``proxy.limits.reading``).

Scoring: the recount's engine prompt count; with an input the proxy cannot count (an
image), every sequence at the model's whole context. Pooling and generative scoring:
``proxy.limits.pooling``. Generation: the prompt exactly when it is token ids or counted
by the caller (``counted_prompt``), else at most one token per byte of the body (the
whole context per prompt when it holds media or re-reads a stored response), and the
completion: the route's cap as vLLM reads it (at most what the context leaves) times the
outputs per prompt, for each prompt or conversation. A request whose shape the pricing
cannot read is refused under a budget (``Price.refusal``), never admitted for a token.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from proxy.accounting.analysis import Analysis
from proxy.accounting.fieldkinds import Reads
from proxy.accounting.operations import GENERATION_OPERATIONS, POOLING_OPERATIONS, Operation
from proxy.accounting.types import ServedModel, Tokenizer
from proxy.limits.limiter import Cost
from proxy.limits.pooling import generative_scoring_cost, is_ids, pooling_cost
from proxy.limits.reading import choices, completion_cap, conversations, media, reading

UNCAPPED = "no completion cap: what the context leaves"
# What a request reserves that vLLM answers without engine work (a body that is no JSON
# object, a model it does not serve: 400 or 404): a token of each kind, so a spent budget
# refuses it while a budget with room admits it (it settles to what its record bills).
UNPRICED = Cost(1, 1)
# A structured decision's read generates at most two tokens (vLLM 0.32.0, strategies.py:
# max_tokens=1, the diffusion canvas 2).
DECISION_REPLY = 2
NO_CONTEXT = "the upstream did not report this model's context (max_model_len)"
UNPARSED: Any = object()  # price_metered's payload when the caller has not parsed the body


@dataclass(frozen=True, slots=True)
class Price:
    """A request's reservation, and whether it is exact or a bound (and which)."""

    cost: Cost
    rule: str
    exact: bool = False
    # A generation without max_tokens: its completion is priced at what the context leaves.
    uncapped: bool = False
    # Why the proxy cannot price it: refused under a budget (400), never forwarded.
    refusal: str | None = None
    # What a refusal of it adds (why it is priced so), said to the client.
    note: str = ""
    # Why it is priced at its bound, its count not come (late, or failed in the proxy):
    # refused, it may still fit once counted (tried again), not never; "": counted.
    late: str = ""


def unreadable(why: str) -> Price:
    """A request the pricing cannot read: refused under a budget."""
    return Price(UNPRICED, f"refused: {why}", refusal=why)


def price_scoring(analysis: Analysis | None) -> Price:
    """A scoring request: the recount, or a bound when it has an input not counted (or
    its count did not come in time: ``analysis`` read without counting); refused when
    it could not even be read (``None``) or its model's context is not known."""
    if analysis is None:
        return unreadable("the proxy could not read this request in time")
    if analysis.counted and analysis.counted.recount:
        return Price(Cost(analysis.counted.recount.engine), "recount", exact=True)
    request, model = analysis.request, analysis.model
    if request is None or model is None:
        return Price(UNPRICED, "unpriced: the request could not be read")
    if model.max_model_len <= 0:
        return unreadable(NO_CONTEXT)
    sequences = len(request.queries) + len(request.documents)
    return Price(Cost(sequences * model.max_model_len), "bound: every sequence at the context")


def parsed(body: bytes) -> Any:
    """``body`` as JSON; None when it is none."""
    try:
        return json.loads(body)
    except ValueError:
        return None


def price_metered(
    operation: Operation,
    body: bytes,
    model: ServedModel | None,
    tokenizer: Tokenizer | None,
    *,
    counted_prompt: int | None = None,
    payload: Any = UNPARSED,
) -> Price:
    """A metered request (runs in a tokenizer thread when ``tokenizer`` is given).

    ``counted_prompt``: the exact total prompt tokens of a text generation request's
    prompts as vLLM renders them (its chat template applied), counted by the caller; it
    replaces the byte bound, and the prompt part of the price is then exact. ``payload``:
    ``body`` parsed (``parsed``) when the caller has it, else it is parsed here."""
    if payload is UNPARSED:
        payload = parsed(body)
    if not isinstance(payload, dict) or model is None:
        return Price(UNPRICED, "unpriced: unknown model or unreadable body (no engine work)")
    if model.max_model_len <= 0:
        return unreadable(NO_CONTEXT)
    context = model.max_model_len
    if operation in POOLING_OPERATIONS:
        found = pooling_cost(operation, payload, context, tokenizer, counted_prompt)
        if found is None:
            return unreadable(f"the proxy cannot read the inputs of this {operation} request")
        cost, exact = found
        return Price(cost, "count" if exact else "bound: inputs not counted at the context", exact)
    if operation == Operation.GENERATIVE_SCORING:
        scored = generative_scoring_cost(payload, context, tokenizer)
        if scored is None:
            return unreadable("the proxy cannot read this request's query and items")
        cost, exact = scored
        return Price(cost, "one engine request per item", exact)
    if operation in GENERATION_OPERATIONS:
        return _generation(operation, payload, body, context, counted_prompt)
    if operation == Operation.DECISIONS:
        return _decisions(payload, body, context)
    return unreadable(f"the proxy cannot price a {operation} request")


def _decisions(payload: dict[str, Any], body: bytes, context: int) -> Price:
    """Structured decisions (``/v1/systemone``: questions by name; ``/v1/decisions``, 0.33+:
    a list): at most one engine request per question (``ReadStrategy.num_requests``), each
    a prompt within the context that holds the state, the instructions and the question (at
    most one token per byte of the body, as a chat; the context with media), and a reply of
    at most ``DECISION_REPLY`` tokens."""
    questions = payload.get("questions")
    reads = len(questions) if isinstance(questions, dict | list) else 0
    if reads == 0:  # vLLM refuses it (400)
        return Price(UNPRICED, "unpriced: a decision with no questions (no engine work)")
    named = any(payload.get(k) for k in ("images", "videos", "audio"))
    each = context if named or media(payload) else min(len(body), context)
    return Price(Cost(each * reads, DECISION_REPLY * reads), "bound: one read per question")


def _generation(
    operation: Operation, payload: dict[str, Any], body: bytes, context: int, counted: int | None
) -> Price:
    """Each prompt (or conversation) is one engine request: its prompt, and a completion
    of the route's cap, at most what the context leaves, per output. vLLM 0.32 clamps a
    cap the prompt leaves no room for (``get_max_tokens``), so a prompt is never bounded
    by ``context - cap``: both parts are reserved whole."""
    ids, texts = _prompts(operation, payload)
    talks = conversations(operation, payload)
    count = len(ids) if ids else len(talks) if talks else texts
    embeds = _embeds(payload)
    if ids:
        prompt, exact = sum(min(len(p), context) for p in ids), True
    elif counted is not None:
        prompt, exact = counted, True
    elif media(payload) or payload.get("previous_response_id") is not None:
        # media, or a stored conversation re-read (Responses): each prompt up to the context
        prompt, exact = context * count, False
    else:
        prompt, exact = min(len(body), context * count), False
    prompt, count = prompt + context * embeds, count + embeds
    cap = completion_cap(operation, payload)
    shortest = min((len(p) for p in ids), default=0) if ids and not embeds else 0
    if counted is not None and count == 1 and not ids:
        shortest = min(counted, context)
    left = max(context - shortest, 0)
    each = min(cap, left) if cap is not None else left
    completion = each * choices(operation, payload) * count
    rule = "prompt ids" if ids else "prompt counted" if exact else "prompt bound"
    if cap is None:
        return Price(Cost(prompt, completion), f"{rule} + {UNCAPPED}", exact, uncapped=True)
    return Price(Cost(prompt, completion), f"{rule} + completion cap", exact)


def _prompts(operation: Operation, payload: dict[str, Any]) -> tuple[list[list[int]], int]:
    """The route's PROMPTS field: its token-id prompts (one, or a batch), and how many
    prompts it holds (a list of texts is a batch; anything else one)."""
    for field in reading(operation, Reads.PROMPTS):
        value = payload.get(field.name)
        if is_ids(value):
            return [list(value)], 1
        if isinstance(value, list) and value and all(is_ids(v) for v in value):
            return [list(v) for v in value], len(value)
        if isinstance(value, list) and value:
            return [], len(value)
    return [], 1


def _embeds(payload: dict[str, Any]) -> int:
    """Prompt embeddings (``--enable-prompt-embeds``): each one prompt of up to the context."""
    value = payload.get("prompt_embeds")
    if value is None:
        return 0
    return len(value) if isinstance(value, list) else 1
