"""What a request asks of the engine, read as vLLM's request model for its route reads it:
the completion cap, the outputs per prompt, the engine requests its lists make, and the
media parts it holds. Read from the parsed body (a JSON parser's view, escapes decoded),
and named by the field table (``proxy.accounting.fields``: ``Field.reads``), never by a
second list: a field the route's model does not have is not read, as vLLM ignores it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pydantic import TypeAdapter, ValidationError

from proxy.accounting.fieldkinds import Field, Reads
from proxy.accounting.fields import FIELDS
from proxy.accounting.operations import Operation

_LAX_INT: TypeAdapter[int] = TypeAdapter(int)
# Content parts vLLM's chat renderer hands to a multimodal processor
# (``renderers/chat_utils.py`` MM_PARSER_MAP, and the parts it reads without a type),
# Responses' input_image / input_file, Anthropic's image: each may cost up to the context.
# Parts vLLM's parser reads by a member of that name, with or without a type.
MEDIA_MEMBERS = frozenset(
    {
        "image_url",
        "image_embeds",
        "image_pil",
        "audio_url",
        "audio_embeds",
        "input_audio",
        "video_url",
        "video_embeds",
    }
)
# Content parts vLLM's chat renderer hands to a multimodal processor
# (``renderers/chat_utils.py`` MM_PARSER_MAP, and the parts it reads without a type),
# Responses' input_image / input_file, Anthropic's image: each may cost up to the context.
MEDIA_TYPES = MEDIA_MEMBERS | {
    "prompt_embeds",
    "input_image",
    "input_file",
    "image",
    "audio",
    "video",
    "document",
}


def reading(operation: Operation, reads: Reads) -> tuple[Field, ...]:
    """The fields of ``operation`` the price reads as ``reads``, in the table's order."""
    fields = FIELDS.get(operation, {})
    return tuple(f for f in fields.values() if f.reads is reads)


def lax_count(value: Any) -> int | None:
    """``value`` as vLLM's models read a count (``8``, ``"8"``, ``8.0``); None when it is
    absent or no count (vLLM refuses such a request, 400)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        count = _LAX_INT.validate_python(value)
    except ValidationError:
        return None
    return count if count >= 0 else None


def completion_cap(operation: Operation, payload: dict[str, Any]) -> int | None:
    """The completion cap vLLM reads for ``operation``: its CAP field, else (absent or
    null) its CAP_FALLBACK field; an absent field is its default; a nested SamplingParams'
    ``max_tokens``. None: no cap (what the context leaves)."""
    for field in (*reading(operation, Reads.CAP), *reading(operation, Reads.CAP_FALLBACK)):
        if field.name not in payload:
            if field.default is not None:
                return field.default
            continue
        if payload[field.name] is not None:
            return lax_count(payload[field.name])
    for field in reading(operation, Reads.SAMPLING):
        params = payload.get(field.name)
        if isinstance(params, dict) and params.get("max_tokens") is not None:
            return lax_count(params["max_tokens"])
    return None


def choices(operation: Operation, payload: dict[str, Any]) -> int:
    """Outputs per prompt: the largest of the route's CHOICES fields (``n``, and
    ``best_of`` where the engine makes them), or a SamplingParams' ``n``; at least 1."""
    values = [payload.get(f.name) for f in reading(operation, Reads.CHOICES)]
    for field in reading(operation, Reads.SAMPLING):
        params = payload.get(field.name)
        values.append(params.get("n") if isinstance(params, dict) else None)
    return max([1, *(lax_count(v) or 1 for v in values)])


def conversations(operation: Operation, payload: dict[str, Any]) -> list[Any] | None:
    """The conversations a request renders, one engine request each: a batch request's
    list of conversations, or its one conversation; None when it has none."""
    for field in reading(operation, Reads.CONVERSATIONS):
        value = payload.get(field.name)
        if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
            return list(value)
        if isinstance(value, list):
            return [value]
    return None


def each(operation: Operation, payload: dict[str, Any]) -> dict[str, list[Any]]:
    """The route's EACH lists the request holds, by field name (one engine request per
    member); a member that is not a list is its one request."""
    found: dict[str, list[Any]] = {}
    for field in reading(operation, Reads.EACH):
        value = payload.get(field.name)
        if value is not None:
            found[field.name] = value if isinstance(value, list) else [value]
    return found


def media(value: Any) -> int:
    """How many media parts ``value`` (parsed JSON) holds: objects whose ``type`` names a
    multimodal part, or that carry a media member without one."""
    return sum(1 for _ in _media_parts(value))


def _media_parts(value: Any) -> Iterator[dict[str, Any]]:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            kind = item.get("type")
            if (isinstance(kind, str) and kind in MEDIA_TYPES) or MEDIA_MEMBERS & item.keys():
                yield item
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
