"""Streamed usage: found in the final chunk, stripped only when the proxy asked for it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.sse import UsageScanner

CHUNK = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}\n\n'
DONE = b"data: [DONE]\n\n"
STREAM = CHUNK + CHUNK + USAGE + DONE


@pytest.mark.parametrize("newline", [b"\n", b"\r\n"], ids=["lf", "crlf"])
@given(cuts=st.lists(st.integers(1, 40), max_size=30))
def test_any_chunking_gives_the_same_events(newline: bytes, cuts: list[int]) -> None:
    """Property: however the bytes are split, the output and the usage are the same
    (a ``\r\n\r\n`` separator split over up to four feeds included)."""
    stream = STREAM.replace(b"\n", newline)
    scanner = UsageScanner(strip=True)
    out, i = b"", 0
    for size in cuts:
        out += scanner.feed(stream[i : i + size])
        i += size
    out += scanner.feed(stream[i:]) + scanner.finish() + scanner.held
    assert out == (CHUNK + CHUNK + DONE).replace(b"\n", newline)
    assert scanner.usage == {"prompt_tokens": 5, "completion_tokens": 2}


def test_usage_kept_when_client_asked() -> None:
    """Without strip the usage chunk reaches the client; [DONE] is held for the caller."""
    scanner = UsageScanner(strip=False)
    assert scanner.feed(STREAM) == CHUNK + CHUNK + USAGE
    assert scanner.held == DONE


def test_an_endless_event_is_passed_on_unread_and_never_held() -> None:
    """Regression: an event that never ended was held whole, and each chunk copied and
    searched all of it again (a 32 MB event in 64 KiB chunks kept the event loop busy for
    16 s). Now the scanner holds at most ``max_event_bytes``, then passes the stream on
    byte for byte and says why its usage was not read."""
    limit = 64 * 1024
    scanner = UsageScanner(strip=True, max_event_bytes=limit)
    stream = [CHUNK, b"data: " + b"x" * 1000] + [b"y" * 1000] * 200 + [b"\n\n", USAGE, DONE]
    out = b""
    for chunk in stream:
        out += scanner.feed(chunk)
        assert scanner.pending <= limit
    out += scanner.finish() + scanner.held
    assert out == b"".join(stream)  # nothing dropped, nothing stripped once unread
    assert scanner.usage is None
    assert scanner.problem is not None
    assert str(limit) in scanner.problem
