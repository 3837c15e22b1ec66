"""Read and edit the ``usage`` object of a scoring response without re-serialising the body.

Edits are surgical: only the bytes of the numbers we change move, so scores, key order,
whitespace and float formatting stay exactly as vLLM wrote them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict

from proxy.wire.jsonio import top_members

# The largest token count a record carries: every JSON parser reads it exactly and
# every sink column (bigint) holds it. Larger or non-integer usage is `invalid`.
MAX_TOKENS = 2**53 - 1

_DECODER = json.JSONDecoder()
_WS = " \t\n\r"


@dataclass(frozen=True, slots=True)
class Span:
    start: int
    end: int


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


class DuplicateKey(ValueError):
    """An object names the same member twice: parsers disagree on which one counts."""


def object_spans(
    text: str, start: int = 0, stop_at: str | None = None
) -> tuple[dict[str, Span], int]:
    """Top-level member value spans of the JSON object starting at ``start``, and its end.

    With ``stop_at``, scanning ends right after that member (its end is then returned):
    vLLM's rerank puts ``usage`` before the large ``results``. Raises DuplicateKey when a
    member name repeats (most JSON clients read the last one, a scanner that stops early
    would read the first), ValueError when the scanned part is not well formed.
    """
    i = _skip_ws(text, start)
    if i >= len(text) or text[i] != "{":
        raise ValueError("not a JSON object")
    spans: dict[str, Span] = {}
    i = _skip_ws(text, i + 1)
    if i < len(text) and text[i] == "}":
        return spans, i + 1
    while True:
        key, i = _DECODER.raw_decode(text, i)
        if not isinstance(key, str):
            raise ValueError("object key is not a string")
        i = _skip_ws(text, i)
        if i >= len(text) or text[i] != ":":
            raise ValueError("expected ':'")
        value_start = _skip_ws(text, i + 1)
        _, value_end = _DECODER.raw_decode(text, value_start)
        if key in spans:
            raise DuplicateKey(f"member {key!r} appears twice")
        spans[key] = Span(value_start, value_end)
        if key == stop_at:
            return spans, value_end
        i = _skip_ws(text, value_end)
        if i < len(text) and text[i] == ",":
            i = _skip_ws(text, i + 1)
            continue
        if i < len(text) and text[i] == "}":
            return spans, i + 1
        raise ValueError("expected ',' or '}'")


def token_count(value: Any) -> int | None:
    """``value`` as a token count, or None when it is not one (bool, float, string,
    negative, or too large for every parser and ledger column to hold exactly)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKENS:
        return value
    return None


def is_error_body(members: dict[str, Any]) -> bool:
    """vLLM's error shapes: ``{"error": {...}}`` (0.10.1+) or ``{"object": "error", ...}``.

    Releases up to 0.17 could send them with HTTP 200; they are never a billable result.
    """
    return "error" in members or members.get("object") == "error"


@dataclass(frozen=True, slots=True)
class UsageView:
    """Where the usage numbers sit in a response body, and the reported prompt count.

    ``problem`` says why the usage cannot be billed as reported (``invalid`` verdict).
    """

    text: str
    usage: Span
    fields: dict[str, Span]
    reported: int | None = None
    problem: str | None = None
    raw: bytes = b""  # the body ``text`` was decoded from (edits splice these bytes)


def _reported(text: str, fields: dict[str, Span]) -> tuple[int | None, str | None]:
    """``prompt_tokens`` (``total_tokens`` for pre-0.13 rerank usage), or the problem."""
    for key in ("prompt_tokens", "total_tokens"):
        span = fields.get(key)
        if span is not None:
            raw = text[span.start : span.end]
            count = token_count(json.loads(raw))
            return (count, None) if count is not None else (None, f"usage.{key} is {raw[:40]}")
    return None, "usage has no prompt_tokens"


def find_usage(body: bytes) -> UsageView | None:
    """The usage object of a successful JSON response body, or None when there is none
    to audit (not JSON, not an object, an error body, no ``usage`` object)."""
    try:
        text = body.decode("utf-8")
        spans, end = _top_level(text)
        if _skip_ws(text, end) != len(text):
            return None  # trailing bytes: not one complete object
        if "error" in spans or _is_error_marker(text, spans.get("object")):
            return None
        usage = spans.get("usage")
        if usage is None or text[usage.start] != "{":
            return None
        fields, _ = object_spans(text, usage.start)
    except DuplicateKey as exc:
        return _duplicated(text, str(exc))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return UsageView(text, usage, fields, *_reported(text, fields), raw=body)


# Member names that, appearing after ``usage``, could change the verdict (a second usage,
# an error marker); when none of them occurs in the rest of the text at all, the rest
# need not be parsed. One regex pass costs a third of three ``str.find`` passes.
_LATER_NAMES = re.compile(r'"(?:usage|error|object)"')


def _top_level(text: str) -> tuple[dict[str, Span], int]:
    """The top-level members up to ``usage``, and the whole object's end when the rest
    cannot matter (the common case: a rerank's large ``results`` is never parsed);
    otherwise every member, so duplicates and error markers are seen."""
    spans, end = object_spans(text, stop_at="usage")
    if "usage" in spans and _LATER_NAMES.search(text, end) is None:
        tail = text.rstrip(_WS)
        return spans, len(tail) if tail.endswith("}") else end
    return object_spans(text)


def _is_error_marker(text: str, span: Span | None) -> bool:
    return span is not None and json.loads(text[span.start : span.end]) == "error"


def _duplicated(text: str, problem: str) -> UsageView | None:
    """A body with a repeated member: invalid if it carries usage at all, else not audited."""
    if '"usage"' not in text:
        return None
    return UsageView(text, Span(0, 0), {}, None, f"ambiguous body: {problem}")


def _splice(view: UsageView, edits: list[tuple[Span, str]]) -> bytes:
    """The body with each span's characters replaced, built in one copy of the body's
    bytes (the answer is large, the edits are a few digits)."""
    raw = view.raw or view.text.encode("utf-8")
    ascii_only = len(raw) == len(view.text)  # then character and byte offsets agree

    def offset(i: int) -> int:
        return i if ascii_only else len(view.text[:i].encode("utf-8"))

    pieces: list[bytes | memoryview] = []
    at, whole = 0, memoryview(raw)
    for span, new in sorted(edits, key=lambda e: e[0].start):
        start = offset(span.start)
        pieces += (whole[at:start], new.encode("utf-8"))
        at = offset(span.end)
    pieces.append(whole[at:])
    return b"".join(pieces)


def rewrite_usage(view: UsageView, engine: int) -> bytes:
    """The body a fixed vLLM would send: prompt and total tokens set to the engine count."""
    names = ("prompt_tokens", "total_tokens")
    return _splice(view, [(view.fields[k], str(engine)) for k in names if k in view.fields])


def annotate_usage(view: UsageView, engine: int | None, verdict: str) -> bytes:
    """Keep the reported numbers and add ``engine_prompt_tokens`` and ``usage_verdict``."""
    close = view.usage.end - 1  # position of the usage object's closing brace
    members = {"engine_prompt_tokens": engine, "usage_verdict": verdict}
    extra = json.dumps(members, separators=(",", ":"))[1:-1]
    separator = "," if view.fields else ""
    return _splice(view, [(Span(close, close), separator + extra)])


@dataclass(frozen=True, slots=True)
class Reading:
    """The usage of a metered answer as its client reads it; ``problem`` when invalid
    (then nothing is billed)."""

    prompt: int | None
    completion: int | None
    problem: str | None = None
    # Prompt tokens the prefix cache served, where vLLM reported them (never inferred).
    cached: int | None = None
    # Seconds of audio, where vLLM billed the answer in seconds (transcriptions).
    seconds: int | None = None


# The Responses and Anthropic Messages APIs name the counts input_tokens and output_tokens.
# vLLM's Messages API leaves out of input_tokens the prompt tokens its cache served or
# filled, and reports them apart; the engine's prompt is the sum (Responses' input_tokens
# already is the whole prompt, and has neither member).
_NAMES = (("prompt_tokens",), ("completion_tokens",))
_IO_NAMES = (
    ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"),
    ("output_tokens",),
)


def reading_of(usage: dict[str, Any]) -> Reading:
    """Validate a usage object: every count present must be a token count."""
    if usage.get("type") == "duration":
        return _duration(usage)
    names = _IO_NAMES if "prompt_tokens" not in usage and "input_tokens" in usage else _NAMES
    counts: list[int | None] = []
    for parts in names:
        total: int | None = None
        for key in parts:
            if usage.get(key) is None:
                continue
            count = token_count(usage[key])
            if count is None:
                return Reading(None, None, f"usage.{key} is {json.dumps(usage[key])[:40]}")
            total = count if total is None else total + count
        counts.append(total)
    prompt, completion = counts
    if prompt is not None and prompt > MAX_TOKENS:
        return Reading(None, None, f"usage.{names[0][0]} and its parts sum to {prompt}")
    cached, problem = _cached(usage)
    if problem is None and cached is not None and cached > (prompt or 0):
        problem = f"{cached} cached prompt tokens of a prompt of {prompt}"
    if problem is not None:
        return Reading(None, None, problem)
    return Reading(prompt, completion, cached=cached)


def _duration(usage: dict[str, Any]) -> Reading:
    """A transcription billed in seconds (vLLM 0.10.2 to 0.32.0, TranscriptionUsageAudio:
    ``{"type": "duration", "seconds": <int>}``, rounded up by vLLM): no tokens."""
    seconds = token_count(usage.get("seconds"))
    if seconds is None:
        return Reading(None, None, f"usage.seconds is {json.dumps(usage.get('seconds'))[:40]}")
    return Reading(None, None, seconds=seconds)


# Where each API reports the prompt tokens its prefix cache served: chat and completions
# (with --enable-prompt-tokens-details), Responses (always), Anthropic Messages.
_CACHED = (
    ("prompt_tokens_details", "cached_tokens"),
    ("input_tokens_details", "cached_tokens"),
    (None, "cache_read_input_tokens"),
)


def _cached(usage: dict[str, Any]) -> tuple[int | None, str | None]:
    """The cached prompt tokens a usage object reports, or the problem with them."""
    for parent, key in _CACHED:
        holder = usage.get(parent) if parent else usage
        if not isinstance(holder, dict) or holder.get(key) is None:
            continue
        count = token_count(holder[key])
        name = f"usage.{parent}.{key}" if parent else f"usage.{key}"
        if count is None:
            return None, f"{name} is {json.dumps(holder[key])[:40]}"
        return count, None
    return None, None


class _Deciding(BaseModel):
    """The top-level members of an answer that decide what it bills."""

    model_config = ConfigDict(extra="ignore")

    usage: Any = None
    error: Any = None
    object: Any = None
    meta: Any = None


NO_USAGE = "no usage in the answer: the engine's work is not billed"


def read_usage(payload: bytes, *, missing: bool = False) -> Reading | None:
    """The usage of a successful JSON answer, read like its client reads it (for a
    repeated member the last one counts); None when there is nothing to bill. With
    ``missing``, an answer that is no error but carries no usage is an invalid reading
    (recorded, billed nothing) instead of None: on a metered route, engine work was done."""
    members = top_members(payload, _Deciding)
    if members is not None and is_error_body(members):
        return None
    if members is None:
        return Reading(None, None, NO_USAGE) if missing else None
    return reading_of_members(members.get("usage"), members.get("meta"), missing=missing)


def reading_of_members(usage: Any, meta: Any, *, missing: bool = False) -> Reading | None:
    """What an answer's top-level ``usage`` (or, Cohere's shape, ``meta``) bills."""
    if isinstance(usage, dict):
        return reading_of(usage)
    found = _billed_units(meta)
    if found is None and missing:
        return Reading(None, None, NO_USAGE)
    return found


def _billed_units(meta: Any) -> Reading | None:
    """Cohere's usage (vLLM's ``/v2/embed``): ``meta.billed_units``, whose input and image
    tokens are together the prompt the engine encoded."""
    units = meta.get("billed_units") if isinstance(meta, dict) else None
    if not isinstance(units, dict):
        return None
    reading = reading_of({"input_tokens": units.get("input_tokens")})
    images = reading_of({"input_tokens": units.get("image_tokens")})
    if reading.problem or images.problem:
        return Reading(None, None, reading.problem or images.problem)
    if reading.prompt is None:
        return Reading(None, None, "meta.billed_units has no input_tokens")
    return Reading(reading.prompt + (images.prompt or 0), None)


def usage_in_metadata(value: str) -> Reading:
    """The usage of a ``bytes`` embeddings or pooling answer: the body is raw tensors and
    vLLM puts the rest of the answer, usage included, in a ``metadata`` header as JSON."""
    try:
        metadata = json.loads(value)
    except ValueError:
        return Reading(None, None, "the metadata header is not JSON")
    usage = metadata.get("usage") if isinstance(metadata, dict) else None
    if not isinstance(usage, dict):
        return Reading(None, None, "the metadata header has no usage object")
    return reading_of(usage)
