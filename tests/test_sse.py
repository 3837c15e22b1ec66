"""Streamed usage: found in the final chunk, stripped only when the proxy asked for it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from proxy.sse import UsageScanner

CHUNK = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}\n\n'
DONE = b"data: [DONE]\n\n"
STREAM = CHUNK + CHUNK + USAGE + DONE


@given(st.lists(st.integers(1, 40), max_size=20))
def test_any_chunking_gives_the_same_events(cuts: list[int]) -> None:
    """Property: however the bytes are split, the output and the usage are the same."""
    scanner = UsageScanner(strip=True)
    out, i = b"", 0
    for size in cuts:
        out += scanner.feed(STREAM[i : i + size])
        i += size
    out += scanner.feed(STREAM[i:]) + scanner.finish() + scanner.held
    assert out == CHUNK + CHUNK + DONE
    assert scanner.usage == {"prompt_tokens": 5, "completion_tokens": 2}


def test_usage_kept_when_client_asked() -> None:
    """Without strip the usage chunk reaches the client; [DONE] is held for the caller."""
    scanner = UsageScanner(strip=False)
    assert scanner.feed(STREAM) == CHUNK + CHUNK + USAGE
    assert scanner.held == DONE
