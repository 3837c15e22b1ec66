"""Server-sent events: find the usage of a streamed completion, optionally hiding it.

Pure: bytes in, bytes out. Events are forwarded as soon as they are complete.
"""

from __future__ import annotations

from typing import Any

from proxy.wire.jsonio import loads

DONE = b"data: [DONE]"
# The last event of vLLM's other streams, held back as ``[DONE]`` is: the Anthropic
# Messages API's ``message_stop``; the Responses API's end, which carries the response
# and its usage (vLLM writes ``response.completed``; the API names two other ends).
_LAST_EVENTS = frozenset(
    {"message_stop", "response.completed", "response.incomplete", "response.failed"}
)


# The longest event the scanner holds while waiting for its end (vLLM's are a few KiB,
# except the first event of a streamed completion with ``echo``, which carries the whole
# prompt and, with ``logprobs``, its top log-probabilities: megabytes for a long prompt).
# A longer event is passed on unread as it comes, and scanning resumes after it.
MAX_EVENT_BYTES = 4 * 1024 * 1024
# The longest event separator, less one: a separator can straddle two chunks.
_SEPARATOR_OVERLAP = len(b"\r\n\r\n") - 1
_USAGE = b'"usage"'
# Bytes of a passed-on event kept to find a separator or ``"usage"`` across two chunks.
_TAIL = max(_SEPARATOR_OVERLAP, len(_USAGE) - 1)


class UsageScanner:
    """Feed stream bytes; get back the bytes to forward now.

    With ``strip`` the usage-only chunk (``choices == []`` with ``usage``) that the proxy
    asked for on the client's behalf is dropped; the stream's last event (``[DONE]``,
    ``message_stop`` or the Responses API's end, with anything after it) is held back in
    ``held`` so the caller can commit the usage record before releasing it.

    Each byte is searched for an event end once, so the cost is linear in the stream
    whatever its chunking. An unfinished event longer than ``max_event_bytes`` is passed
    on as it comes, unread, and the events after it are read as before: a client cannot
    make a stream's usage unreadable by asking for a large first event. Only when such an
    event may hold the stream's last usage (it contains ``"usage"`` and no usage was read
    after it), or no usage follows it at all, does ``problem`` say why the usage is not
    known.
    """

    def __init__(self, *, strip: bool, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self._strip = strip
        self._max_event = max_event_bytes
        self._buffer = bytearray()
        self._searched = 0  # bytes at the buffer's start known to hold no separator
        self._passing: bytes | None = None  # the last bytes of an event passed on unread
        self._passed = False  # an event was passed on unread
        self._unread_usage = False  # ... holding "usage", and no usage was read after it
        self.usage: dict[str, Any] | None = None
        self.held = b""

    @property
    def problem(self) -> str | None:
        """Why the stream's usage is not known, if it is not."""
        too_long = f"a stream event longer than {self._max_event} bytes was passed on unread"
        if self._unread_usage:
            return f"{too_long} and held the last usage"
        if self._passed and self.usage is None:
            return f"{too_long} and no usage followed"
        return None

    def feed(self, chunk: bytes) -> bytes:
        out: list[bytes] = []
        if self._passing is not None:
            end = self._pass_on(chunk)
            if end < 0:
                return chunk
            out.append(chunk[:end])
            chunk = chunk[end:]
        self._buffer += chunk
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
            self._passed = True
            self._passing = bytes(self._buffer[-_TAIL:])
            self._note_usage(self._buffer)
            out.append(self.finish())
        return b"".join(out)

    def _pass_on(self, chunk: bytes) -> int:
        """The unread event continues with ``chunk``: the index in ``chunk`` just past the
        event's end, or -1 while it goes on. Only the few bytes around the chunk's start
        are copied (a separator or ``"usage"`` may straddle two chunks)."""
        assert self._passing is not None
        edge = self._passing + chunk[:_TAIL]
        end = _event_end(edge, 0)  # the tail alone holds no separator
        end = end - len(self._passing) if end >= 0 else _event_end(chunk, 0)
        if _USAGE in edge or chunk.find(_USAGE, 0, len(chunk) if end < 0 else end) >= 0:
            self._unread_usage = True
        if end < 0:
            self._passing = (
                (self._passing + chunk)[-_TAIL:] if len(chunk) < _TAIL else chunk[-_TAIL:]
            )
            return -1
        self._passing = None
        return end

    def _note_usage(self, data: bytes | bytearray) -> None:
        if _USAGE in data:
            self._unread_usage = True

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
        if self.held:  # nothing overtakes a held end
            return self._hold(event)
        data = _data(event)
        if data is None:
            return event
        if data.strip() == b"[DONE]":
            return self._hold(event)
        try:
            parsed = loads(data)
        except ValueError:
            return event
        if not isinstance(parsed, dict):
            return event
        kind = parsed.get("type")
        ending = isinstance(kind, str) and kind in _LAST_EVENTS
        # A Responses stream's usage is in its last event, inside the response.
        holder = (
            parsed["response"] if ending and isinstance(parsed.get("response"), dict) else parsed
        )
        if isinstance(holder.get("usage"), dict):
            self.usage = holder["usage"]
            self._unread_usage = False
            if self._strip and holder is parsed and not parsed.get("choices"):
                return b""
        return self._hold(event) if ending else event

    def _hold(self, event: bytes) -> bytes:
        """Keep the stream's end for the caller to release once the record is committed."""
        self.held += event
        return b""


def _event_end(buffer: bytes | bytearray, start: int) -> int:
    """Index just past the first complete event (ended by a blank line, ``\n\n`` or
    ``\r\n\r\n``) whose separator begins at or after ``start``, or -1.

    Steps from newline to newline (``find`` of one byte is a ``memchr``): an event's JSON
    holds its newlines escaped, so the first one is mostly where the event ends."""
    i = buffer.find(b"\n", start)
    while i >= 0:
        if buffer[i + 1 : i + 2] == b"\n":
            return i + 2
        if i > start and buffer[i - 1 : i + 3] == b"\r\n\r\n":
            return i + 3
        i = buffer.find(b"\n", i + 1)
    return -1


def _data(event: bytes) -> bytes | None:
    lines = [line[5:].lstrip(b" ") for line in event.splitlines() if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None
