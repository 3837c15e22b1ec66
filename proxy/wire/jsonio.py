"""JSON parsing for request and answer bodies: pydantic's parser first, the standard
library's second.

pydantic-core's ``from_json`` (the jiter parser, already here with pydantic) is several
times faster than ``json.loads`` on request bodies (docs/performance.md), and keeps
integers of any size, NaN and Infinity as ``json.loads`` does. What it refuses (a byte-order mark,
UTF-16 bodies, lone surrogate escapes, and malformed JSON) is read again by
``json.loads``: every body means exactly what it meant before, and what neither accepts
raises ValueError as ``json.loads`` does.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import from_json


def loads(data: bytes | str) -> Any:
    """Parse ``data`` as ``json.loads`` would, faster on well-formed JSON."""
    try:
        return from_json(data, cache_strings="keys")
    except ValueError:
        return json.loads(data)


def top_members(data: bytes, members: type[BaseModel]) -> dict[str, Any] | None:
    """The top-level members that ``members`` declares (as ``Any`` fields, ignoring
    extras) and ``data`` holds, read as ``loads`` would read them (for a repeated member
    the last counts); None when ``data`` is not a JSON object.

    pydantic-core reads them straight from the bytes and skips everything else without
    making Python objects of it, so a large body holds the GIL for a fraction of a whole
    parse and leaves no copy (docs/reliability.md, "event loop"). What its parser refuses
    is read by ``loads``, as everywhere else.
    """
    try:
        found = members.model_validate_json(data)
    except ValidationError as exc:
        if any(error["type"] != "json_invalid" for error in exc.errors()):
            return None  # valid JSON, but not an object
    else:
        return {name: getattr(found, name) for name in found.model_fields_set}
    parsed = load_object(data)
    if parsed is None:
        return None
    return {name: parsed[name] for name in members.model_fields if name in parsed}


def load_object(data: bytes) -> dict[str, Any] | None:
    """``data`` parsed by ``loads`` when it is a JSON object, else None (not JSON,
    not UTF-8, nested too deep, or another JSON value)."""
    try:
        parsed = loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return parsed if isinstance(parsed, dict) else None


def with_members(data: bytes, members: dict[str, Any]) -> bytes:
    """The JSON object ``data`` with ``members`` written after its own, which every reader
    that keeps the last of a repeated member (``json.loads``, pydantic, so vLLM) reads
    instead of any the object already has. Spliced before the closing brace, so a large
    body is not parsed again; a body that is not plain UTF-8 JSON (a byte-order mark,
    UTF-16) is parsed and written whole. Raises ValueError when ``data`` is no object."""
    end = data.rstrip(b" \t\r\n")
    if data[:1] == b"{" and end.endswith(b"}"):
        head = end[:-1].rstrip(b" \t\r\n")
        added = json.dumps(members)[1:-1].encode()
        return head + (b"" if head == b"{" else b",") + added + b"}"
    parsed = load_object(data)
    if parsed is None:
        raise ValueError("not a JSON object")
    return json.dumps({**parsed, **members}).encode()
