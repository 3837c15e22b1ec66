"""Streamed usage: found in the final chunk, stripped only when the proxy asked for it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.wire.sse import UsageScanner

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


LIMIT = 64 * 1024


def feed_all(scanner: UsageScanner, chunks: list[bytes]) -> bytes:
    """Everything the scanner lets out for ``chunks``; it never holds more than LIMIT."""
    out = b""
    for chunk in chunks:
        out += scanner.feed(chunk)
        assert scanner.pending <= LIMIT
    return out + scanner.finish() + scanner.held


def long_event(size: int, content: bytes = b"x") -> list[bytes]:
    """A streamed completion's echo event of about ``size`` bytes, in 1,000-byte chunks."""
    event = b'data: {"choices":[{"text":"' + content * (size // len(content)) + b'"}]}\n\n'
    return [event[i : i + 1000] for i in range(0, len(event), 1000)]


def test_a_long_event_is_passed_on_unread_and_the_rest_is_still_read() -> None:
    """Regression: an event longer than the bound ended the scanning, so a client could
    make a stream free (recorded ``invalid``, nothing billed) by asking for a large first
    event: ``echo`` with ``logprobs`` on a long prompt. The scanner also held the whole
    event and searched it again for each chunk (a 32 MB event in 64 KiB chunks kept the
    event loop busy for 16 s). Now the long event passes on as it comes, never held
    beyond the bound, and the usage after it is read and stripped."""
    scanner = UsageScanner(strip=True, max_event_bytes=LIMIT)
    giant = long_event(4 * LIMIT)
    out = feed_all(scanner, [CHUNK, *giant, USAGE, DONE])
    assert out == CHUNK + b"".join(giant) + DONE
    assert scanner.usage == {"prompt_tokens": 5, "completion_tokens": 2}
    assert scanner.problem is None


def test_an_endless_event_is_passed_on_and_says_why_nothing_is_billed() -> None:
    """An event that never ends is passed on byte for byte; no usage, and a problem that
    says why the stream is not billed."""
    scanner = UsageScanner(strip=True, max_event_bytes=LIMIT)
    giant = long_event(4 * LIMIT)[:-1]  # never ends
    out = feed_all(scanner, [CHUNK, *giant])
    assert out == CHUNK + b"".join(giant)
    assert scanner.usage is None
    assert scanner.problem is not None
    assert "no usage followed" in scanner.problem
    assert str(LIMIT) in scanner.problem


def test_a_long_event_that_may_hold_the_last_usage_makes_it_unknown() -> None:
    """With continuous usage stats every event carries usage: an unread one after the
    last read usage may hold the final count, so none is billed; a usage read after it
    settles it again."""
    with_usage = long_event(4 * LIMIT, b'"usage": ')
    scanner = UsageScanner(strip=False, max_event_bytes=LIMIT)
    feed_all(scanner, [USAGE, *with_usage, DONE])
    assert scanner.problem is not None
    assert "held the last usage" in scanner.problem
    scanner = UsageScanner(strip=False, max_event_bytes=LIMIT)
    feed_all(scanner, [*with_usage, USAGE, DONE])
    assert scanner.problem is None
    assert scanner.usage == {"prompt_tokens": 5, "completion_tokens": 2}


@pytest.mark.parametrize("newline", [b"\n", b"\r\n"], ids=["lf", "crlf"])
@given(cuts=st.lists(st.integers(1, 300), max_size=40), size=st.integers(0, 400))
def test_any_chunking_around_a_long_event_gives_the_same_events(
    newline: bytes, cuts: list[int], size: int
) -> None:
    """Property: with events longer than the bound among them, however the bytes are
    split, the client gets every byte but the stripped usage, and the usage is read
    (the separators and ``"usage"`` straddling chunks of a passed-on event included)."""
    limit = 100
    middle = b'data: {"choices":[{"text":"' + b"u" * size + b'", "usage": 1}]}\n\n'
    events = [CHUNK, middle, CHUNK, middle, USAGE, DONE]
    stream = b"".join(events).replace(b"\n", newline)
    scanner = UsageScanner(strip=True, max_event_bytes=limit)
    out, i = b"", 0
    for size_ in cuts:
        out += scanner.feed(stream[i : i + size_])
        assert scanner.pending <= limit
        i += size_
    out += scanner.feed(stream[i:]) + scanner.finish() + scanner.held
    assert out == stream.replace(USAGE.replace(b"\n", newline), b"")
    assert scanner.usage == {"prompt_tokens": 5, "completion_tokens": 2}
    assert scanner.problem is None


@given(cuts=st.lists(st.integers(1, 50), min_size=1, max_size=60), size=st.integers(200, 400))
def test_usage_in_a_passed_on_event_is_seen_however_it_is_split(cuts: list[int], size: int) -> None:
    """Property: ``"usage"`` split across any two chunks of an unread event still
    counts as an unread usage (the last usage read before it is then not billed). The
    chunks are at most 50 bytes, so the event (over 230) is never complete while held."""
    event = b'data: {"choices":[],"x":"' + b"u" * size + b'","usage":{}}\n\n'
    stream = USAGE + event + DONE
    scanner = UsageScanner(strip=False, max_event_bytes=100)
    out, i, turn = b"", 0, 0
    while i < len(stream):
        size_ = cuts[turn % len(cuts)]
        out += scanner.feed(stream[i : i + size_])
        i, turn = i + size_, turn + 1
    out += scanner.finish() + scanner.held
    assert out == stream
    assert scanner.problem is not None
    assert "held the last usage" in scanner.problem


@pytest.mark.parametrize("newline", [b"\n", b"\r\n"], ids=["lf", "crlf"])
def test_the_end_of_a_passed_on_event_is_found_at_every_split(newline: bytes) -> None:
    """Every way to split the end of an unread event over two chunks: the usage event
    after it is still read (and stripped)."""
    long = (b'data: {"choices":[{"text":"' + b"x" * 150 + b'"}]}\n\n').replace(b"\n", newline)
    usage = USAGE.replace(b"\n", newline)
    for cut in range(len(long) - 12, len(long) + 3):
        scanner = UsageScanner(strip=True, max_event_bytes=100)
        head = long[:90]
        out = scanner.feed(head) + scanner.feed(long[90:120])  # now passing it on
        rest = long[120:] + usage
        out += scanner.feed(rest[: cut - 120]) + scanner.feed(rest[cut - 120 :])
        assert out + scanner.finish() == long, cut
        assert scanner.usage == {"prompt_tokens": 5, "completion_tokens": 2}, cut


def sse(event: str, data: dict[str, Any]) -> bytes:
    """One event as vLLM's Responses and Messages APIs write it."""
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


MESSAGES = [
    sse(
        "message_start",
        {
            "type": "message_start",
            "message": {
                "id": "chatcmpl-1",
                "type": "message",
                "role": "assistant",
                "content": [],
                "model": "m",
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": 4, "cache_read_input_tokens": 8, "output_tokens": 0},
            },
        },
    ),
    sse(
        "content_block_start",
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    ),
    sse(
        "content_block_delta",
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}},
    ),
    sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
    sse(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"input_tokens": 4, "cache_read_input_tokens": 8, "output_tokens": 3},
        },
    ),
    sse("message_stop", {"type": "message_stop"}),
]


def _response(status: str, usage: dict[str, Any] | None) -> dict[str, Any]:
    return {"id": "resp_1", "object": "response", "status": status, "output": [], "usage": usage}


RESPONSES = [
    sse(
        "response.created",
        {
            "type": "response.created",
            "sequence_number": 0,
            "response": _response("in_progress", None),
        },
    ),
    sse(
        "response.output_text.delta",
        {"type": "response.output_text.delta", "sequence_number": 1, "delta": "hi"},
    ),
    sse(
        "response.completed",
        {
            "type": "response.completed",
            "sequence_number": 2,
            "response": _response(
                "completed", {"input_tokens": 12, "output_tokens": 3, "total_tokens": 15}
            ),
        },
    ),
]


@pytest.mark.parametrize(
    ("events", "usage"),
    [
        (MESSAGES, {"input_tokens": 4, "cache_read_input_tokens": 8, "output_tokens": 3}),
        (RESPONSES, {"input_tokens": 12, "output_tokens": 3, "total_tokens": 15}),
    ],
    ids=["messages", "responses"],
)
@pytest.mark.parametrize("size", [1, 7, 64, 4096])
def test_messages_and_responses_streams_are_read_and_their_last_event_held(
    events: list[bytes], usage: dict[str, Any], size: int
) -> None:
    """A Messages stream's usage is in its ``message_delta`` (``message_start`` holds
    the prompt only, inside ``message``); a Responses stream's in ``response.completed``,
    inside ``response``. Their last event (``message_stop``, ``response.completed``)
    is held back as ``[DONE]`` is, so the record is committed before the stream ends."""
    stream = b"".join(events)
    scanner = UsageScanner(strip=False)
    out = b"".join(scanner.feed(stream[i : i + size]) for i in range(0, len(stream), size))
    assert out + scanner.finish() == b"".join(events[:-1])
    assert scanner.held == events[-1]
    assert scanner.usage == usage
    assert scanner.problem is None


def test_odd_members_and_events_after_the_end_change_nothing() -> None:
    """A ``type`` that is no string is just data; whatever follows a held end stays
    behind it, in order."""
    odd = b'data: {"type":{"a":1},"choices":[]}\n\n'
    scanner = UsageScanner(strip=False)
    assert scanner.feed(odd + USAGE + DONE + b": ping\n\n") == odd + USAGE
    assert scanner.held == DONE + b": ping\n\n"
