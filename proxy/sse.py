"""Server-sent events: find the usage of a streamed completion, optionally hiding it.

Pure: bytes in, bytes out. Events are forwarded as soon as they are complete.
"""

from __future__ import annotations

from typing import Any

from proxy.jsonio import loads

DONE = b"data: [DONE]"


# The longest event the scanner holds while waiting for its end (vLLM's are a few KiB at
# most, logprobs included). Past it the stream is passed on unread.
MAX_EVENT_BYTES = 4 * 1024 * 1024
# The longest event separator, less one: a separator can straddle two chunks.
_SEPARATOR_OVERLAP = len(b"\r\n\r\n") - 1


class UsageScanner:
    """Feed stream bytes; get back the bytes to forward now.

    With ``strip`` the usage-only chunk (``choices == []`` with ``usage``) that the proxy
    asked for on the client's behalf is dropped; the ``[DONE]`` event is held back in
    ``held`` so the caller can commit the usage record before releasing it.

    Each byte is searched for an event end once, so the cost is linear in the stream
    whatever its chunking. An unfinished event longer than ``max_event_bytes`` ends the
    scanning: it and everything after it are passed on as they come, and ``problem`` says
    why the stream's usage was not read.
    """

    def __init__(self, *, strip: bool, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self._strip = strip
        self._max_event = max_event_bytes
        self._buffer = bytearray()
        self._searched = 0  # bytes at the buffer's start known to hold no separator
        self.usage: dict[str, Any] | None = None
        self.problem: str | None = None
        self.held = b""

    def feed(self, chunk: bytes) -> bytes:
        if self.problem is not None:
            return chunk
        self._buffer += chunk
        out: list[bytes] = []
        while True:
            cut = _event_end(self._buffer, max(self._searched - _SEPARATOR_OVERLAP, 0))
            if cut < 0:
                self._searched = len(self._buffer)
                break
            event = bytes(self._buffer[:cut])
            del self._buffer[:cut]
            self._searched = 0
            out.append(self._route(event))
        if len(self._buffer) > self._max_event:
            self.problem = (
                f"a stream event longer than {self._max_event} bytes: "
                "the rest of the stream was passed on unread"
            )
            out.append(self.finish())
        return b"".join(out)

    @property
    def pending(self) -> int:
        """Bytes of an unfinished event held back."""
        return len(self._buffer)

    def finish(self) -> bytes:
        """Whatever trailing bytes remain (a stream that ended without a blank line)."""
        rest = bytes(self._buffer)
        self._buffer.clear()
        self._searched = 0
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


def _event_end(buffer: bytearray, start: int) -> int:
    """Index just past the first complete event (blank-line terminated) whose separator
    begins at or after ``start``, or -1."""
    best = -1
    for sep in (b"\n\n", b"\r\n\r\n"):
        i = buffer.find(sep, start)
        if i >= 0 and (best < 0 or i + len(sep) < best):
            best = i + len(sep)
    return best


def _data(event: bytes) -> bytes | None:
    lines = [line[5:].lstrip(b" ") for line in event.splitlines() if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None
