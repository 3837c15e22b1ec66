"""What a metered request is, read the way vLLM reads it: the operation (``/invocations``
dispatches by body), the model it names, whether it streams, and the body to send.

Pure: bytes in, a decision out. Fields are read with pydantic in lax mode, as vLLM's
request models do (``"stream": "true"`` and ``1`` mean true).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from proxy.accounting.routes import STREAMING_OPERATIONS, operation_of
from proxy.accounting.shapes import ambiguity, parse_rerank, parse_score
from proxy.accounting.types import Family
from proxy.wire.jsonio import load_object, top_members

_LAX_BOOL: TypeAdapter[bool] = TypeAdapter(bool)

# The pooling task vLLM picks for each scoring family (model_config.get_pooling_task).
_POOLING_TASK = {
    Family.BI_ENCODER: "embed",
    Family.LATE_INTERACTION: "token_embed",
    Family.CROSS_ENCODER: "classify",
    Family.TEMPLATE_RERANKER: "classify",
    Family.JINA_V3: "classify",
}


@dataclass(frozen=True, slots=True)
class Prepared:
    """A metered request as the proxy will forward and record it."""

    body: bytes
    operation: str
    model: str | None
    streamed: bool = False
    strip_usage: bool = False
    # A feature the engine serves without a usage the proxy can bill (see
    # ``unbillable_feature``); such a request is refused unless --allow-unmetered names it.
    unbillable: str | None = None
    # Why the proxy cannot know how vLLM reads the body (``shapes.ambiguity``): refused.
    ambiguous: str | None = None


def lax_bool(value: Any) -> bool:
    """``value`` as vLLM's pydantic models read a bool field; invalid means false (vLLM
    answers 400 and nothing is billed)."""
    try:
        return _LAX_BOOL.validate_python(value)
    except ValidationError:
        return False


def model_task(family: Family | None, generates: bool) -> str | None:
    """The task vLLM runs a served model with (None: unknown to the proxy)."""
    if generates:
        return "generate"
    return _POOLING_TASK.get(family) if family else None


def invocation_operation(payload: Any, task: str | None) -> str:
    """The endpoint vLLM's ``/invocations`` hands ``payload`` to: the first request type
    that validates, generation types first, then the model's pooling task, rerank, score.
    With the task unknown, the body's shape decides in the same order.
    """
    if not isinstance(payload, dict):
        return "other"
    chat_like = "messages" in payload
    if task in ("generate", None) and chat_like:
        return "chat"
    if task in ("generate", None) and "prompt" in payload:
        return "completions"
    if task in ("embed", None) and ("input" in payload or chat_like):
        return "embeddings"
    if task == "classify" and ("input" in payload or chat_like):
        return "classify"
    if parse_rerank(payload) is not None:
        return "rerank"
    if parse_score(payload) is not None:
        return "score"
    return "pooling" if task not in ("generate", None) else "other"


class _Head(BaseModel):
    """The members of a request to a direct endpoint that decide how it is forwarded and
    recorded (the rest, inputs or messages, is not read)."""

    model_config = ConfigDict(extra="ignore")

    model: Any = None
    stream: Any = None
    stream_options: Any = None
    encoding_format: Any = None
    background: Any = None


def unbillable_feature(operation: str, payload: dict[str, Any], direct: bool) -> str | None:
    """The feature of a request whose answer carries no usage: embeddings or pooling as
    ``bytes_only`` (raw tensors, no metadata; on ``/invocations`` whatever operation the
    body looks like, since vLLM may read it as another), or a background response
    (answered queued, the engine's work done after the answer)."""
    pooled = operation in ("embeddings", "pooling") or not direct
    if pooled and payload.get("encoding_format") == "bytes_only":
        return "embeddings.bytes_only"
    if operation == "responses" and lax_bool(payload.get("background")):
        return "responses.background"
    return None


def prepare(
    path: str,
    body: bytes,
    task_of: Callable[[str | None], str | None] = lambda _: None,
    adapter: str | None = None,
    adapter_names_model: bool = True,
) -> Prepared:
    """Read one metered request; for a stream that did not ask for
    ``stream_options.include_usage``, the body to send asks for it (the proxy then hides
    that chunk from the client). A direct endpoint's request is read for its deciding
    members only; ``/invocations`` is dispatched by its whole body. From 0.11.1 vLLM's
    ``/invocations`` (``inject_adapter_id``) sets the body's ``model`` to the SageMaker
    ``adapter`` header's value, None without the header (the default model), whatever the
    body names (``adapter_names_model``); so does the proxy, or a tenant could record any
    model name."""
    direct = operation_of(path)
    payload = as_sent = top_members(body, _Head) if direct else load_object(body)
    if payload is None:
        return Prepared(body, direct or "other", None)
    if adapter_names_model and not direct:
        payload = {**payload, "model": adapter}
    model = payload.get("model") if isinstance(payload.get("model"), str) else None
    if not direct and (unclear := ambiguity(payload, "invocations")) is not None:
        return Prepared(body, "other", model, ambiguous=unclear)
    operation = direct or invocation_operation(payload, task_of(model))
    unbillable = unbillable_feature(operation, payload, direct is not None)
    if unbillable is not None:
        return Prepared(body, operation, model, unbillable=unbillable)
    if operation not in STREAMING_OPERATIONS or not lax_bool(payload.get("stream")):
        return Prepared(body, operation, model)
    options = payload.get("stream_options")
    if isinstance(options, dict) and lax_bool(options.get("include_usage")):
        return Prepared(body, operation, model, streamed=True)
    options = dict(options) if isinstance(options, dict) else {}
    options["include_usage"] = True
    whole = load_object(body) if direct else as_sent
    if whole is None:  # cannot happen: its members were read, so it is an object
        return Prepared(body, operation, model)
    sent = json.dumps({**whole, "stream_options": options}).encode()
    return Prepared(sent, operation, model, streamed=True, strip_usage=True)
