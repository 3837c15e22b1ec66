"""Request boundary: parse score and rerank bodies (spec section 2) into one normalised shape.

Parsing never decides what vLLM accepts: a body that fails here is still forwarded unchanged,
it just cannot be audited.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from proxy.accounting.operations import Operation
from proxy.accounting.routes import BY_PATH
from proxy.accounting.types import Pairing, Truncation
from proxy.wire.jsonio import load_object

Item = str | dict[str, Any]
Endpoint = Literal["score", "rerank"]


# The field pairs of a score request, in the order vLLM's request union tries them.
_SCORE_FIELD_PAIRS = (
    ("queries", "documents"),
    ("queries", "items"),
    ("data_1", "data_2"),
    ("text_1", "text_2"),
)


# The inputs of each request type vLLM's /invocations tries, by the members they need.
_INVOCATION_INPUTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("chat messages", ("messages",)),
    ("a completion prompt", ("prompt",)),
    ("pooling input", ("input",)),
    ("a rerank query and documents", ("query", "documents")),
    *((f"score {a}/{b}", (a, b)) for a, b in _SCORE_FIELD_PAIRS),
)

# A member name of a score input pair anywhere in a body: fewer than three distinct ones
# cannot make two whole pairs, so most bodies are cleared by this one scan.
_PAIR_NAME = re.compile(rb'"(queries|documents|items|data_1|data_2|text_1|text_2)"\s*:')


def score_ambiguity(body: bytes) -> str | None:
    """``ambiguity`` of a score body, parsed only when a first scan finds enough names."""
    if len(set(_PAIR_NAME.findall(body))) < 3:
        return None
    return ambiguity(load_object(body), "score")  # not a JSON object: vLLM answers 400


def ambiguity(payload: Any, endpoint: str) -> str | None:
    """Why the proxy cannot know which inputs vLLM will read from ``payload``, or None.

    vLLM reads a score body as the first member of a pydantic union that validates
    (queries/documents, queries/items, data_1/data_2, text_1/text_2; fewer pairs before
    0.16, only text_1/text_2 before 0.15), and an ``/invocations`` body as the first
    request type that validates. When a body carries the inputs of two of them, which one
    is used turns on whether each input validates as that release's types, which the
    proxy does not replicate: a tenant could have the proxy count one pair while the
    engine scores another (issue #30 review: a /score bill cut to 9 % of the engine's
    work). Such a body is refused, never guessed."""
    if not isinstance(payload, dict):
        return None
    choices = _INVOCATION_INPUTS if endpoint == "invocations" else _INVOCATION_INPUTS[4:]
    named = [name for name, members in choices if all(m in payload for m in members)]
    if len(named) < 2:
        return None
    return (
        f"the body holds the inputs of more than one request ({', '.join(named)}); "
        "vLLM would read only one of them: send one"
    )


class _ScoringFields(BaseModel):
    """Fields common to score and rerank that change token counts; unknown fields are allowed."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    truncate_prompt_tokens: int | None = None
    truncation_side: Literal["left", "right"] | None = None
    max_tokens_per_query: int = 0
    max_tokens_per_doc: int = 0
    padding: Literal["max_length", "do_not_pad"] | None = None
    instruction: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class RerankBody(_ScoringFields):
    query: str | dict[str, Any]
    documents: str | dict[str, Any] | list[str | dict[str, Any]]
    top_n: int = 0


class ScoreBody(_ScoringFields):
    first: str | dict[str, Any] | list[str | dict[str, Any]]
    second: str | dict[str, Any] | list[str | dict[str, Any]]


@dataclass(frozen=True, slots=True)
class ScoringRequest:
    """A score or rerank request reduced to what accounting needs."""

    endpoint: Endpoint
    model: str | None
    queries: tuple[Item, ...]
    documents: tuple[Item, ...]
    truncation: Truncation
    # What a score template is rendered with: chat_template_kwargs, and the top-level
    # ``instruction`` folded in (explicit keys win), as vLLM's request validator does.
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)

    @property
    def pairing(self) -> Pairing | None:
        """1:1, 1:N or N:N; None when vLLM will reject the lengths (it answers 400)."""
        m, n = len(self.queries), len(self.documents)
        if m == 0 or n == 0:
            return None
        if m == 1 and n == 1:
            return Pairing.ONE_TO_ONE
        if m == 1:
            return Pairing.ONE_TO_N
        return Pairing.N_TO_N if m == n else None


def endpoint_for_path(path: str) -> Endpoint | Literal["invocations"] | None:
    route = BY_PATH.get(path)
    if route is None:
        return None
    if route.operation in (Operation.SCORE, Operation.RERANK, Operation.INVOCATIONS):
        return route.operation  # type: ignore[return-value]
    return None


def _template_kwargs(body: _ScoringFields) -> dict[str, Any]:
    merged = dict(body.chat_template_kwargs or {})
    if body.instruction is not None:
        merged.setdefault("instruction", body.instruction)
    return merged


def _as_items(value: Item | list[Item]) -> tuple[Item, ...]:
    return tuple(value) if isinstance(value, list) else (value,)


def _truncation(body: _ScoringFields) -> Truncation:
    return Truncation(
        truncate_prompt_tokens=body.truncate_prompt_tokens,
        truncation_side=body.truncation_side,
        max_tokens_per_query=body.max_tokens_per_query,
        max_tokens_per_doc=body.max_tokens_per_doc,
        pad_to_max_length=body.padding == "max_length",
    )


def parse_rerank(payload: Any) -> ScoringRequest | None:
    """A rerank request, or None when the body does not validate as one."""
    try:
        body = RerankBody.model_validate(payload)
    except ValidationError:
        return None
    return ScoringRequest(
        endpoint="rerank",
        model=body.model,
        queries=(body.query,),
        documents=_as_items(body.documents),
        truncation=_truncation(body),
        template_kwargs=_template_kwargs(body),
    )


def parse_score(payload: Any) -> ScoringRequest | None:
    """A score request in any of its four field-pair spellings, or None."""
    if not isinstance(payload, dict):
        return None
    for first, second in _SCORE_FIELD_PAIRS:
        if first in payload and second in payload:
            fields = {k: v for k, v in payload.items() if k not in (first, second)}
            try:
                body = ScoreBody.model_validate(
                    {**fields, "first": payload[first], "second": payload[second]}
                )
            except ValidationError:
                return None
            return ScoringRequest(
                endpoint="score",
                model=body.model,
                queries=_as_items(body.first),
                documents=_as_items(body.second),
                truncation=_truncation(body),
                template_kwargs=_template_kwargs(body),
            )
    return None


def parse_scoring_request(endpoint: str, payload: Any) -> ScoringRequest | None:
    """Normalise a body for an audited endpoint; /invocations tries rerank, then score."""
    if endpoint == "rerank":
        return parse_rerank(payload)
    if endpoint == "score":
        return parse_score(payload)
    return parse_rerank(payload) or parse_score(payload)
