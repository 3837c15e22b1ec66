"""Read and edit the ``usage`` object of a scoring response without re-serialising the body.

Edits are surgical: only the bytes of the numbers we change move, so scores, key order,
whitespace and float formatting stay exactly as vLLM wrote them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

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


def object_spans(
    text: str, start: int = 0, stop_at: str | None = None
) -> tuple[dict[str, Span], int]:
    """Top-level member value spans of the JSON object starting at ``start``, and its end.

    With ``stop_at``, scanning ends right after that member (its end is then returned):
    vLLM's rerank puts ``usage`` before the large ``results``, which need not be scanned.
    Raises ValueError when the scanned part is not a well-formed object.
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


@dataclass(frozen=True, slots=True)
class UsageView:
    """Where the usage numbers sit in a response body, and the reported prompt count."""

    text: str
    usage: Span
    fields: dict[str, Span]

    @property
    def reported(self) -> int | None:
        """``prompt_tokens``, or ``total_tokens`` for pre-0.13 rerank usage."""
        for key in ("prompt_tokens", "total_tokens"):
            span = self.fields.get(key)
            if span is not None:
                value = json.loads(self.text[span.start : span.end])
                if isinstance(value, int) and not isinstance(value, bool):
                    return value
                return None
        return None


def find_usage(body: bytes) -> UsageView | None:
    """The usage object of a JSON response body, or None when there is none to audit."""
    try:
        text = body.decode("utf-8")
        if not text.rstrip(_WS).endswith("}"):
            return None  # truncated or trailing garbage: not a complete object
        spans, end = object_spans(text, stop_at="usage")
        if "usage" not in spans and _skip_ws(text, end) != len(text):
            return None
        usage = spans.get("usage")
        if usage is None or text[usage.start] != "{":
            return None
        fields, _ = object_spans(text, usage.start)
    except (ValueError, UnicodeDecodeError):
        return None
    return UsageView(text, usage, fields)


def _replace(view: UsageView, values: dict[str, int]) -> str:
    edits = sorted(
        ((view.fields[k], str(v)) for k, v in values.items() if k in view.fields),
        key=lambda e: e[0].start,
        reverse=True,
    )
    text = view.text
    for span, new in edits:
        text = text[: span.start] + new + text[span.end :]
    return text


def rewrite_usage(view: UsageView, engine: int) -> bytes:
    """The body a fixed vLLM would send: prompt and total tokens set to the engine count."""
    return _replace(view, {"prompt_tokens": engine, "total_tokens": engine}).encode("utf-8")


def annotate_usage(view: UsageView, engine: int | None, verdict: str) -> bytes:
    """Keep the reported numbers and add ``engine_prompt_tokens`` and ``usage_verdict``."""
    text = view.text
    close = view.usage.end - 1  # position of the usage object's closing brace
    members = {"engine_prompt_tokens": engine, "usage_verdict": verdict}
    extra = json.dumps(members, separators=(",", ":"))[1:-1]
    separator = "," if view.fields else ""
    return (text[:close] + separator + extra + text[close:]).encode("utf-8")
