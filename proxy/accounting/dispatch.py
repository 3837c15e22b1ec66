"""What a metered request is, read the way vLLM reads it: the operation (``/invocations``
dispatches by body), the model it names, whether it streams, and the body to send.

Pure: bytes in, a decision out. Fields are read with pydantic in lax mode, as vLLM's
request models do (``"stream": "true"`` and ``1`` mean true).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, create_model

from proxy.accounting.fieldkinds import Effect, Field
from proxy.accounting.fields import FIELDS
from proxy.accounting.operations import CHOICES_OPERATIONS, STREAMING_OPERATIONS, Operation
from proxy.accounting.routes import operation_of
from proxy.accounting.shapes import ambiguity, parse_rerank, parse_score
from proxy.accounting.types import Family, Release
from proxy.wire.jsonio import load_object, top_members

_LAX_BOOL: TypeAdapter[bool] = TypeAdapter(bool)
_LAX_INT: TypeAdapter[int] = TypeAdapter(int)

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
    operation: Operation
    model: str | None
    streamed: bool = False
    strip_usage: bool = False
    # A feature the engine serves without a usage the proxy can bill (see
    # ``unbillable_feature``); such a request is refused unless --allow-unmetered names it.
    unbillable: str | None = None
    # Why the proxy cannot know how vLLM reads the body (``shapes.ambiguity``): refused.
    ambiguous: str | None = None
    # Why the proxy refuses the request outright (400, nothing forwarded): a field it
    # cannot let through, named by ``param``.
    refusal: Refusal | None = None
    # How many times the engine reads the prompt (``n`` choices each read it once; the
    # usage reports it once): what the reconciler expects of the engine's counter.
    copies: int = 1
    # Cross-request state the body names: the Responses API's ``previous_response_id``,
    # and the client's own ``cache_salt`` (combined with the tenant's, never replaced by it).
    previous_response_id: str | None = None
    cache_salt: str | None = None


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request the proxy answers 400 without forwarding it."""

    message: str
    param: str


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


def invocation_operation(payload: Any, task: str | None) -> Operation:
    """The endpoint vLLM's ``/invocations`` hands ``payload`` to: the first request type
    that validates, generation types first, then the model's pooling task, rerank, score.
    With the task unknown, the body's shape decides in the same order.
    """
    if not isinstance(payload, dict):
        return Operation.OTHER
    chat_like = "messages" in payload
    if task in ("generate", None) and chat_like:
        return Operation.CHAT
    if task in ("generate", None) and ("prompt" in payload or "prompt_embeds" in payload):
        # a completion from prompt embeddings alone (``--enable-prompt-embeds``) is one too
        return Operation.COMPLETIONS
    if task in ("embed", None) and ("input" in payload or chat_like):
        return Operation.EMBEDDINGS
    if task == "classify" and ("input" in payload or chat_like):
        return Operation.CLASSIFY
    if parse_rerank(payload) is not None:
        return Operation.RERANK
    if parse_score(payload) is not None:
        return Operation.SCORE
    return Operation.POOLING if task not in ("generate", None) else Operation.OTHER


# Request fields vLLM copies into its answer, or into every event of a stream, and that
# no engine limit bounds (``request_id`` into each chunk's ``id``, the Responses API's
# ``metadata``, ``user``, ``text``... into its events): the field table's echoed fields
# that are not also billed. Their size together, as JSON, is bounded: above it the request
# is refused before it is forwarded, so the event that carries a stream's usage stays
# within the scanner's bound (``proxy.wire.sse.MAX_EVENT_BYTES``) and is read.
ECHOED: Mapping[Operation, tuple[str, ...]] = {
    operation: tuple(
        sorted(
            name
            for name, field in fields.items()
            if Effect.ECHOED in field.effects and Effect.BILLED not in field.effects
        )
    )
    for operation, fields in FIELDS.items()
}
ECHO_MAX_BYTES = 64 * 1024
# Every field vLLM echoes, billed ones too (Responses' instructions and tools: rendered into
# the prompt only as far as the chat template renders them): at most this together.
ECHOED_ALL: Mapping[Operation, tuple[str, ...]] = {
    operation: tuple(sorted(n for n, f in fields.items() if Effect.ECHOED in f.effects))
    for operation, fields in FIELDS.items()
}
ECHO_ALL_MAX_BYTES = 1024 * 1024
# The fields the field table says multiply engine work, per operation.
MULTIPLYING: Mapping[Operation, tuple[Field, ...]] = {
    operation: tuple(f for f in fields.values() if Effect.MULTIPLIES in f.effects)
    for operation, fields in FIELDS.items()
}


class _Head(BaseModel):
    """The members of a request to a direct endpoint that decide how it is forwarded and
    recorded (the rest, inputs or messages, is not read), and state the proxy checks."""

    model_config = ConfigDict(extra="ignore")

    model: Any = None
    stream: Any = None
    stream_options: Any = None
    encoding_format: Any = None
    background: Any = None
    n: Any = None
    sampling_params: Any = None
    previous_response_id: Any = None
    cache_salt: Any = None
    request_id: Any = None


def _head(operation: Operation) -> type[BaseModel]:
    """``_Head`` and the fields of ``operation`` the field table bounds (echoed) or refuses
    (multiplying): read from every direct request, so none passes unseen."""
    names = {*ECHOED_ALL.get(operation, ()), *(f.name for f in MULTIPLYING.get(operation, ()))}
    extra: dict[str, Any] = {n: (Any, None) for n in sorted(names - set(_Head.model_fields))}
    model: type[BaseModel] = create_model(f"_Head_{operation}", __base__=_Head, **extra)
    return model


HEADS: Mapping[Operation, type[BaseModel]] = {operation: _head(operation) for operation in FIELDS}


def unbillable_feature(operation: Operation, payload: dict[str, Any], direct: bool) -> str | None:
    """The feature of a request whose answer carries no usage: embeddings or pooling as
    ``bytes_only`` (raw tensors, no metadata; on ``/invocations`` whatever operation the
    body looks like, since vLLM may read it as another), or a background response
    (answered queued, the engine's work done after the answer)."""
    pooled = operation in (Operation.EMBEDDINGS, Operation.POOLING) or not direct
    if pooled and payload.get("encoding_format") == "bytes_only":
        return "embeddings.bytes_only"
    if operation == Operation.RESPONSES and lax_bool(payload.get("background")):
        return "responses.background"
    for field in MULTIPLYING.get(operation, ()):
        if field.feature is not None and MULTIPLIERS[field.name](payload):
            return field.feature
    return None


def _asks_beam_search(payload: dict[str, Any]) -> bool:
    """vLLM runs one engine request per beam per generated token, each re-reading the
    prompt and the tokens so far (``beam_search``); the usage reports the prompt once."""
    return lax_bool(payload.get("use_beam_search"))


def _asks_best_of(payload: dict[str, Any]) -> bool:
    """The V0 engine (to 0.10) makes ``best_of`` sequences and returns ``n``; the usage
    counts the ``n`` (V1 refuses ``best_of`` > 1)."""
    return _lax_int(payload.get("best_of"), 1) > _lax_int(payload.get("n"), 1)


# Whether a body asks for what each multiplying field of the table does, by field name
# (a test holds every multiplying field of the table to an entry here).
def _asks_joint_reads(payload: dict[str, Any]) -> bool:
    """Structured decisions read jointly (0.33+, diffusion models): one engine request per
    canvas of questions, its width unknown to the proxy. ``joint`` is a StrictBool in
    vLLM's model: only JSON ``true`` asks for it (anything else is its 400)."""
    return payload.get("joint") is True


MULTIPLIERS: Mapping[str, Callable[[dict[str, Any]], bool]] = {
    "use_beam_search": _asks_beam_search,
    "best_of": _asks_best_of,
    "joint": _asks_joint_reads,
}
# What ``--allow-unmetered`` may name besides paths.
# Audio answers without a usage (``proxy.accounting.audio``): a whole translation, a whole
# transcription before 0.10 or in verbose_json.
AUDIO_FEATURES = frozenset(
    {"transcriptions.whole", "transcriptions.verbose_json", "translations.whole"}
)
UNMETERED_FEATURES = frozenset(
    {
        "responses.background",
        "embeddings.bytes_only",
        *AUDIO_FEATURES,
        *(f.feature for fields in MULTIPLYING.values() for f in fields if f.feature),
    }
)
# The first release whose request model of each generating operation takes ``cache_salt``
# (read from each release's protocol; 0.10 takes it on chat, completions and Responses but
# refuses it on the V0 engine, so the proxy salts from 0.11, which has only V1). Pooling
# answers report no cached tokens, and their salt is not set.
CACHE_SALT_FROM: dict[str, tuple[int, int]] = {
    Operation.CHAT: (0, 11),
    Operation.COMPLETIONS: (0, 11),
    Operation.RESPONSES: (0, 11),
    Operation.GENERATE: (0, 26),
    Operation.MESSAGES: (0, 29),
    Operation.DECISIONS: (0, 32),
}


def echo_refusal(operation: Operation, payload: dict[str, Any]) -> Refusal | None:
    """The refusal of a body whose echoed fields together exceed ``ECHO_MAX_BYTES`` (those
    vLLM does not bill) or ``ECHO_ALL_MAX_BYTES`` (all of them)."""
    for named, most in ((ECHOED, ECHO_MAX_BYTES), (ECHOED_ALL, ECHO_ALL_MAX_BYTES)):
        fields = named.get(operation, ())
        sizes = {n: _json_size(payload[n]) for n in fields if payload.get(n) is not None}
        if sum(sizes.values()) > most:
            return Refusal(
                f"{', '.join(sorted(sizes))}: {sum(sizes.values())} bytes that vLLM copies "
                f"into its answer; the proxy accepts at most {most} bytes of such fields",
                max(sizes, key=sizes.__getitem__),
            )
    return None


def _json_size(value: Any) -> int:
    if isinstance(value, str) and value.isascii():
        return len(value) + 2
    return len(json.dumps(value, default=str).encode())


def copies(operation: Operation, payload: dict[str, Any]) -> int:
    """How many times the engine reads the prompt: ``n`` (``sampling_params.n`` on
    generate) for the operations with choices; 1 where it is absent or invalid (vLLM
    answers an invalid one 400, and nothing is billed)."""
    if operation not in CHOICES_OPERATIONS:
        return 1
    params = payload.get("sampling_params") if operation == Operation.GENERATE else payload
    return _lax_int(params.get("n") if isinstance(params, dict) else None, 1)


def _lax_int(value: Any, default: int) -> int:
    """``value`` as vLLM's models read an int, at least 1; ``default`` when absent or
    invalid (vLLM answers an invalid one 400, and nothing is billed)."""
    try:
        return max(_LAX_INT.validate_python(value), 1) if value is not None else default
    except ValidationError:
        return default


def responses_refusal(payload: dict[str, Any]) -> Refusal | None:
    """A Responses request that chooses its own ``request_id``: vLLM stores the response
    under it (``response_store[request.request_id]``), so a chosen id could overwrite
    another tenant's stored response; the proxy mints every response id instead."""
    if payload.get("request_id") is None:
        return None
    return Refusal(
        "request_id: the proxy mints the id of every stored response, so that no tenant "
        "can name (and overwrite) another's; send the request without it",
        "request_id",
    )


def takes_cache_salt(operation: Operation, release: Release) -> bool:
    """Whether ``release``'s request model of ``operation`` takes a ``cache_salt``."""
    first = CACHE_SALT_FROM.get(operation)
    return first is not None and release.since(first)


TOO_DEEP = (
    "the body is nested deeper than the proxy reads JSON; vLLM may read it, so it is "
    "refused rather than forwarded unread"
)


def too_deep(body: bytes) -> bool:
    """Whether ``body`` is JSON the proxy's parser cannot read for its nesting alone (a
    newer Python, as vLLM's images run, reads deeper: the engine would run a request
    whose fields the proxy never saw). Other unreadable bodies vLLM refuses itself."""
    try:
        json.loads(body)
    except RecursionError:
        return True
    except (ValueError, UnicodeDecodeError):
        return False
    return False


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def prepare(
    path: str,
    body: bytes,
    task_of: Callable[[str | None], str | None] = lambda _: None,
    adapter: str | None = None,
    adapter_names_model: bool = True,
) -> Prepared:
    """Read one metered request; for a stream that did not ask for
    ``stream_options.include_usage``, the body to send asks for it, and for no continuous
    usage stats (the proxy then hides the usage chunk from the client). A direct
    endpoint's request is read for its deciding members only; ``/invocations`` is
    dispatched by its whole body. From 0.11.1 vLLM's ``/invocations``
    (``inject_adapter_id``) sets the body's ``model`` to the SageMaker ``adapter`` header's
    value, None without the header (the default model), whatever the body names
    (``adapter_names_model``); so does the proxy, or a tenant could record any model
    name."""
    direct = operation_of(path)
    payload = as_sent = top_members(body, HEADS.get(direct, _Head)) if direct else load_object(body)
    if payload is None:
        refusal = Refusal(TOO_DEEP, "body") if too_deep(body) else None
        return Prepared(body, direct or Operation.OTHER, None, refusal=refusal)
    if adapter_names_model and not direct:
        payload = {**payload, "model": adapter}
    model = payload.get("model") if isinstance(payload.get("model"), str) else None
    if not direct and (unclear := ambiguity(payload, "invocations")) is not None:
        return Prepared(body, Operation.OTHER, model, ambiguous=unclear)
    operation = direct or invocation_operation(payload, task_of(model))
    refusal = echo_refusal(operation, payload)
    if refusal is None and operation == Operation.RESPONSES:
        refusal = responses_refusal(payload)
    if refusal is not None:
        return Prepared(body, operation, model, refusal=refusal)
    prepared = Prepared(
        body,
        operation,
        model,
        copies=copies(operation, payload),
        previous_response_id=_text(payload.get("previous_response_id")),
        cache_salt=_text(payload.get("cache_salt")),
        # a relay --allow-unmetered allows is still kept apart (owned ids, salts)
        unbillable=unbillable_feature(operation, payload, direct is not None),
    )
    if prepared.unbillable is not None:
        return prepared
    if operation not in STREAMING_OPERATIONS or not lax_bool(payload.get("stream")):
        return prepared
    options = payload.get("stream_options")
    if isinstance(options, dict) and lax_bool(options.get("include_usage")):
        return replace(prepared, streamed=True)
    options = dict(options) if isinstance(options, dict) else {}
    options["include_usage"] = True
    # vLLM sends continuous usage stats only with include_usage: asked for by the client
    # alone, they gave it no usage, and the proxy's include_usage must not turn them on.
    options.pop("continuous_usage_stats", None)
    whole = load_object(body) if direct else as_sent
    if whole is None:  # cannot happen: its members were read, so it is an object
        return prepared
    sent = json.dumps({**whole, "stream_options": options}).encode()
    return replace(prepared, body=sent, streamed=True, strip_usage=True)
