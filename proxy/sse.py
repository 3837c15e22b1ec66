"""Server-sent events: find the usage of a streamed completion, optionally hiding it.

Pure: bytes in, bytes out. Events are forwarded as soon as they are complete.
"""

from __future__ import annotations

from typing import Any

from proxy.jsonio import loads

DONE = b"data: [DONE]"


class UsageScanner:
    """Feed stream bytes; get back the bytes to forward now.

    With ``strip`` the usage-only chunk (``choices == []`` with ``usage``) that the proxy
    asked for on the client's behalf is dropped; the ``[DONE]`` event is held back in
    ``held`` so the caller can commit the usage record before releasing it.
    """

    def __init__(self, *, strip: bool) -> None:
        self._strip = strip
        self._buffer = b""
        self.usage: dict[str, Any] | None = None
        self.held = b""

    def feed(self, chunk: bytes) -> bytes:
        self._buffer += chunk
        out: list[bytes] = []
        while True:
            cut = _event_end(self._buffer)
            if cut < 0:
                break
            event, self._buffer = self._buffer[:cut], self._buffer[cut:]
            out.append(self._route(event))
        return b"".join(out)

    def finish(self) -> bytes:
        """Whatever trailing bytes remain (a stream that ended without a blank line)."""
        rest, self._buffer = self._buffer, b""
        return rest

    def _route(self, event: bytes) -> bytes:
        data = _data(event)
        if data is None:
            return event
        if data.strip() == b"[DONE]":
            self.held += event
            return b""
        try:
            parsed = loads(data)
        except ValueError:
            return event
        if isinstance(parsed, dict) and isinstance(parsed.get("usage"), dict):
            self.usage = parsed["usage"]
            if self._strip and not parsed.get("choices"):
                return b""
        return event


def _event_end(buffer: bytes) -> int:
    """Index just past the first complete event (blank-line terminated), or -1."""
    best = -1
    for sep in (b"\n\n", b"\r\n\r\n"):
        i = buffer.find(sep)
        if i >= 0 and (best < 0 or i + len(sep) < best):
            best = i + len(sep)
    return best


def _data(event: bytes) -> bytes | None:
    lines = [line[5:].lstrip(b" ") for line in event.splitlines() if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None
