"""A realtime session's usage, read from its events as they pass."""

from __future__ import annotations

import json

import pytest

from proxy.wire.realtime import SessionUsage


def done(prompt: object, completion: object) -> str:
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": 0}
    return json.dumps({"type": "transcription.done", "text": "hi", "usage": usage})


def test_the_done_usages_of_a_session_add_up() -> None:
    """Each utterance's transcription.done adds its tokens; deltas add nothing."""
    session = SessionUsage()
    session.from_server(json.dumps({"type": "transcription.delta", "delta": "transcription.done"}))
    session.from_server(done(10, 3))
    session.from_server(done(7, 2))
    assert (session.prompt, session.completion, session.done) == (17, 5, 2)
    assert session.why_unbilled is None


@pytest.mark.parametrize(
    "event",
    [
        done("10", 3),
        done(-1, 3),
        json.dumps({"type": "transcription.done", "text": "hi", "usage": None}),
        json.dumps({"type": "transcription.done", "text": "hi"}),
    ],
)
def test_a_done_without_a_readable_usage_makes_the_session_invalid(event: str) -> None:
    """vLLM's done always has a usage (UsageInfo); one without is named, not billed 0."""
    session = SessionUsage()
    session.from_server(done(10, 3))
    session.from_server(event)
    assert session.why_unbilled is not None
    assert "readable usage" in session.why_unbilled


def test_a_session_without_a_done_is_unbilled() -> None:
    """No transcription.done: the reason says the engine's work is not billed."""
    session = SessionUsage()
    session.from_server(json.dumps({"type": "session.created", "id": "s", "created": 1}))
    assert session.why_unbilled is not None
    assert "without a transcription.done" in session.why_unbilled


@pytest.mark.parametrize(
    ("messages", "model"),
    [
        ([{"type": "session.update", "model": "w"}], "w"),
        ([{"type": "session.update", "model": "w"}, {"type": "session.update"}], "w"),
        ([{"type": "input_audio_buffer.append", "audio": "session.update"}], None),
        ([{"type": "session.update", "model": 3}], None),
    ],
)
def test_the_model_is_the_last_session_update_names(
    messages: list[dict[str, object]], model: str | None
) -> None:
    """session.update names the model; other events, and a model that is no string, do not."""
    session = SessionUsage()
    for message in messages:
        session.from_client(json.dumps(message))
    session.from_client("not json session.update")
    assert session.model == model
