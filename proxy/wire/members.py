"""The top-level members of a JSON object read as it passes, chunk by chunk: an answer too
large to hold is still billed from its ``usage``, wherever in the object vLLM wrote it.

Only the structure is followed (depth, strings, member names at depth 1); values are not
parsed, but for the value of a top-level ``usage`` member, which is kept (bounded) and
parsed at the end. Pure and incremental: ``feed`` costs one regex step per string or
bracket, no copy of the answer is kept.
"""

from __future__ import annotations

import json
import re
from typing import Any

_STRUCTURE = re.compile(rb'["{}\[\],:]')
_STRING_BODY = re.compile(rb'[^"\\]*+(?:\\.[^"\\]*+)*+', re.S)


def _nested(levels: int) -> re.Pattern[bytes]:
    """Inside a nested value: everything up to the bracket that closes it, whole strings
    and up to ``levels`` levels of complete inner arrays and objects skipped in one match
    (possessive: no backtracking), so the scan pays per top-level member, not per token."""
    text = rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"'
    inner = rb'(?:[^"{}\[\]]++|' + text + rb")*+"
    for _ in range(levels):
        inner = rb'(?:[^"{}\[\]]++|' + text + rb"|[{\[]" + inner + rb"[}\]])*+"
    return re.compile(inner, re.S)


_SKIP_NESTED = _nested(6)
_WHITESPACE = b" \t\n\r"
# A usage (or meta) object is a few hundred bytes; past this the member is not kept.
USAGE_MAX_BYTES = 64 * 1024
_NAME_MAX_BYTES = 64


def _decoded(name: bytes) -> bytes:
    """A member name as JSON reads it (``"us\\u0061ge"`` is ``usage``)."""
    if b"\\" not in name:
        return name
    try:
        return str(json.loads(b'"' + name + b'"')).encode()
    except ValueError:
        return name


class TopLevelMembers:
    """Feed the bytes of one JSON object in order; ``get(name)`` then gives a kept
    top-level member (``usage``, and Cohere's ``meta``) as ``json.loads`` of the whole
    would (the last one, when repeated), or None: no such member, a top-level ``error``
    member, or not one JSON object."""

    def __init__(self, kept: tuple[str, ...] = ("usage", "meta")) -> None:
        self._kept = frozenset(name.encode() for name in kept)
        self._kept_values: dict[bytes, bytes | None] = {}
        self._depth = 0
        self._in_string = False
        self._escape = False  # the last byte fed was a backslash inside a string
        self._expect_name = False  # at depth 1, the next string is a member name
        self._name: bytearray | None = None  # the member name being read
        self._last_name = b""
        self._value: bytearray | None = None  # the kept value being read
        self._value_name = b""
        self._error = False
        self._closed = False  # the top-level object has ended
        self._broken = False

    def feed(self, chunk: bytes) -> None:
        if self._broken:
            return
        i, n = 0, len(chunk)
        start = 0  # where the part of this chunk that belongs to a kept value starts
        while i < n:
            if self._in_string:
                i = self._string(chunk, i)
                continue
            if self._closed:
                if chunk[i:].strip(_WHITESPACE):
                    self._broken = True
                return
            if self._depth >= 2:
                skipped = _SKIP_NESTED.match(chunk, i)
                i = skipped.end() if skipped else i
                if i >= n:
                    break
            found = _STRUCTURE.search(chunk, i)
            if found is None:
                break
            i = found.start()
            byte = chunk[i]
            if byte == 0x22:  # "
                self._in_string = True
                if self._depth == 1 and self._expect_name:
                    self._name = bytearray()
                i += 1
            elif byte in (0x7B, 0x5B):  # { [
                if self._depth == 0 and byte == 0x5B:
                    self._broken = True
                    return
                self._depth += 1
                self._expect_name = self._depth == 1
                i += 1
            elif byte in (0x7D, 0x5D):  # } ]
                if self._depth == 1:
                    self._end_value(chunk, start, i)
                    self._closed = True
                self._depth -= 1
                i += 1
            elif byte == 0x2C:  # ,
                if self._depth == 1:
                    self._end_value(chunk, start, i)
                    self._expect_name = True
                i += 1
            else:  # :
                if self._depth == 1 and not self._expect_name:
                    self._start_value()
                    start = i + 1
                i += 1
        if self._value is not None:
            self._keep(chunk[start:])

    def _string(self, chunk: bytes, i: int) -> int:
        """Inside a string from ``i``: past its end, or to the end of the chunk."""
        if self._escape:
            self._escape = False
            self._name_part(chunk[i : i + 1])
            i += 1
            if i >= len(chunk):
                return i
        body = _STRING_BODY.match(chunk, i)
        end = body.end() if body else i
        self._name_part(chunk[i:end])
        if end < len(chunk) and chunk[end] == 0x22:
            self._in_string = False
            if self._name is not None:
                self._last_name, self._name = _decoded(bytes(self._name)), None
                self._expect_name = False
            return end + 1
        if end < len(chunk):  # a lone backslash ends the chunk
            self._escape = True
            self._name_part(chunk[end : end + 1])
        return len(chunk)

    def _name_part(self, part: bytes) -> None:
        if self._name is not None and len(self._name) <= _NAME_MAX_BYTES:
            self._name += part

    def _start_value(self) -> None:
        if self._last_name == b"error":
            self._error = True
        if self._last_name in self._kept:
            self._value, self._value_name = bytearray(), self._last_name

    def _end_value(self, chunk: bytes, start: int, end: int) -> None:
        if self._value is None:
            return
        self._keep(chunk[start:end])
        value, self._value = self._value, None
        kept = bytes(value) if len(value) <= USAGE_MAX_BYTES else None
        self._kept_values[self._value_name] = kept

    def _keep(self, part: bytes) -> None:
        assert self._value is not None
        if len(self._value) <= USAGE_MAX_BYTES:
            self._value += part[: USAGE_MAX_BYTES + 1 - len(self._value)]

    def get(self, name: str) -> Any:
        """A kept top-level member's value once the whole object was fed, else None."""
        raw = self._kept_values.get(name.encode())
        if self._broken or not self._closed or self._error or raw is None:
            return None
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return None

    def usage(self) -> Any:
        return self.get("usage")
